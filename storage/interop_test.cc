// Export's file handling: temporary files are created fresh (O_EXCL | O_NOFOLLOW), so a name
// planted next to the output, even as a link to someone else's file, is never written through.
// Export and import as bounded pipelines: any memory budget (even one smaller than a tensor),
// overlapped or not, gives the same bytes, with buffers reused across batches.
#include "storage/interop.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

TEST(InteropTest, ExportNeverWritesThroughAPlantedTemporaryName) {
  const std::string dir = TestDir("planted");
  std::vector<float> w(16, 1.5f);
  CheckpointContents c;
  c.tensors = {{"w", DType::kF32, {16}}};
  PieceData piece;
  piece.key = "w";
  piece.region = WholeRegion({16});
  piece.data = w.data();
  piece.size_bytes = 64;
  c.files = {{0, {piece}}};
  const std::string ckpt = JoinPath(dir, "ckpt");
  ASSERT_TRUE(WriteCheckpoint(ckpt, c, WriteOptions{}).ok());
  const std::string victim = JoinPath(dir, "victim.txt");
  ASSERT_TRUE(WriteFileDurably(victim, "someone else's").ok());
  const std::string out = JoinPath(dir, "out");
  ASSERT_TRUE(MakeDir(out).ok());
  // Links under the temporary names an export in this process could pick.
  std::vector<std::string> planted = {
      JoinPath(out, absl::StrCat("model.safetensors.tmp-", ::getpid()))};
  for (int n = 0; n < 8; ++n) {
    planted.push_back(JoinPath(out, absl::StrCat(".model.safetensors.tmp-", ::getpid(), "-", n)));
  }
  for (const std::string& p : planted) ASSERT_EQ(::symlink(victim.c_str(), p.c_str()), 0);

  auto files = ExportCheckpoint(ckpt, out, ExportOptions{});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(ReadWholeFile(victim, 1 << 20).value_or(""), "someone else's");
  for (const std::string& p : planted) {
    char target[4096] = {};
    ASSERT_GT(::readlink(p.c_str(), target, sizeof(target) - 1), 0) << p << " was replaced";
    EXPECT_EQ(std::string(target), victim);
  }
  auto size = FileSize(JoinPath(out, "model.safetensors"));
  ASSERT_TRUE(size.ok());
  EXPECT_GT(*size, 64);
}

// A checkpoint of tensors with odd sizes, each stored as two pieces (rows split), so an export
// assembles every tensor from two data files.
std::string WriteOddCheckpoint(const std::string& dir, std::vector<std::vector<float>>* values) {
  CheckpointContents c;
  const std::vector<int64_t> rows = {3, 17, 1, 64, 5, 33, 2, 129};
  values->clear();
  c.files.resize(2);
  c.files[1].writer_rank = 1;
  for (size_t t = 0; t < rows.size(); ++t) {
    const int64_t cols = 7 + static_cast<int64_t>(t) * 13;
    const std::string key = absl::StrCat("layer", t, ".w");
    c.tensors.push_back({key, DType::kF32, {rows[t], cols}});
    values->emplace_back(rows[t] * cols);
    for (size_t i = 0; i < values->back().size(); ++i) {
      values->back()[i] = static_cast<float>(t * 100000 + i) * 0.25f;
    }
    const int64_t half = rows[t] / 2;
    for (int part = 0; part < 2; ++part) {
      const int64_t r0 = part == 0 ? 0 : half, r1 = part == 0 ? half : rows[t];
      if (r1 == r0) continue;
      PieceData p;
      p.key = key;
      p.region = Region{{r0, 0}, {r1 - r0, cols}, {}};
      p.data = values->back().data() + r0 * cols;
      p.size_bytes = (r1 - r0) * cols * 4;
      c.files[part].pieces.push_back(p);
    }
  }
  const std::string ckpt = JoinPath(dir, "ckpt");
  absl::StatusOr<pb::Manifest> m = WriteCheckpoint(ckpt, c, WriteOptions{});
  EXPECT_TRUE(m.ok()) << m.status();
  return ckpt;
}

std::string Slurp(const std::string& path) {
  return ReadWholeFile(path, int64_t{1} << 30).value_or("<unreadable " + path + ">");
}

TEST(InteropTest, ExportGivesTheSameFileUnderAnyBudgetAndReusesItsBuffers) {
  const std::string dir = TestDir("export_budget");
  std::vector<std::vector<float>> values;
  const std::string ckpt = WriteOddCheckpoint(dir, &values);
  ExportOptions whole;  // the default budget holds every tensor in one batch
  ASSERT_TRUE(ExportCheckpoint(ckpt, JoinPath(dir, "whole.safetensors"), whole).ok());
  const std::string expected = Slurp(JoinPath(dir, "whole.safetensors"));
  ASSERT_GT(expected.size(), 4096u);
  for (int64_t budget : {int64_t{64}, int64_t{2048}, int64_t{20000}}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(absl::StrCat("budget ", budget, " overlap ", overlap));
      PipelineStats stats;
      ExportOptions o;
      o.memory_budget_bytes = budget;  // smaller than the largest tensor (129 x 98 x 4 bytes)
      o.overlap = overlap;
      o.stats = &stats;
      const std::string out = JoinPath(dir, absl::StrCat("b", budget, overlap, ".safetensors"));
      auto files = ExportCheckpoint(ckpt, out, o);
      ASSERT_TRUE(files.ok()) << files.status();
      EXPECT_EQ(Slurp(out), expected);
      // Several batches, yet each of the two slots and the scratch buffer is allocated once.
      EXPECT_GE(stats.steps, 3);
      EXPECT_LE(stats.buffer_allocations, 3);
      EXPECT_LE(stats.peak_buffer_bytes, 1 + 2 * std::max<int64_t>(budget / 2, 129 * 98 * 4));
    }
  }
}

TEST(InteropTest, ImportGivesTheSameCheckpointUnderAnyBudget) {
  const std::string dir = TestDir("import_budget");
  std::vector<std::vector<float>> values;
  const std::string ckpt = WriteOddCheckpoint(dir, &values);
  const std::string st = JoinPath(dir, "model.safetensors");
  ASSERT_TRUE(ExportCheckpoint(ckpt, st, ExportOptions{}).ok());
  ImportOptions big;
  auto expected = ImportSafetensors(st, JoinPath(dir, "big"), big);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->files_size(), 1);
  const std::string expected_bytes = Slurp(JoinPath(dir, "big/" + expected->files(0).name()));
  for (int64_t budget : {int64_t{1}, int64_t{8192}, int64_t{3 * 4096 * 2}}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(absl::StrCat("budget ", budget, " overlap ", overlap));
      PipelineStats stats;
      ImportOptions o;
      o.memory_budget_bytes = budget;  // chunks of 4 KiB or 12 KiB: tensors span chunks
      o.overlap = overlap;
      o.stats = &stats;
      const std::string out = JoinPath(dir, absl::StrCat("small", budget, overlap));
      auto m = ImportSafetensors(st, out, o);
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_EQ(m->pieces_size(), expected->pieces_size());
      for (int p = 0; p < m->pieces_size(); ++p) {
        EXPECT_EQ(m->pieces(p).xxh3_64(), expected->pieces(p).xxh3_64()) << m->pieces(p).key();
        EXPECT_EQ(m->pieces(p).byte_offset(), expected->pieces(p).byte_offset());
      }
      EXPECT_EQ(Slurp(JoinPath(out, m->files(0).name())), expected_bytes);
      EXPECT_GE(stats.steps, 6);
      EXPECT_LE(stats.buffer_allocations, 2);
      EXPECT_LE(stats.peak_buffer_bytes, 2 * std::max<int64_t>(4096, budget / 2));
    }
  }
  // And the bytes are the tensors': read back through the checkpoint reader.
  auto reader = CheckpointReader::Open(JoinPath(dir, "small11"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> got(values[7].size());
  ASSERT_TRUE((*reader)->ReadRegion("layer7.w", WholeRegion({129, 98}), got.data()).ok());
  EXPECT_EQ(got, values[7]);
}

TEST(InteropTest, ImportErrorNamesTheTruncatedSourceFile) {
  const std::string dir = TestDir("import_truncated");
  std::vector<std::vector<float>> values;
  const std::string ckpt = WriteOddCheckpoint(dir, &values);
  const std::string st = JoinPath(dir, "model.safetensors");
  ASSERT_TRUE(ExportCheckpoint(ckpt, st, ExportOptions{}).ok());
  ASSERT_EQ(::truncate(st.c_str(), 4096 * 3), 0);
  ImportOptions o;
  o.memory_budget_bytes = 8192;
  auto m = ImportSafetensors(st, JoinPath(dir, "out"), o);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr(st));
  EXPECT_FALSE(PathExists(JoinPath(dir, "out")));
}

}  // namespace
}  // namespace ckpt
