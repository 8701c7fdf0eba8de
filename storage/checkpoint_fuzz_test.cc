// Corrupts a real checkpoint's manifest and data files (random byte flips and truncations) and
// opens/reads it: every outcome must be an error or correct data; never a crash or an
// out-of-bounds access (this target also runs under AddressSanitizer).
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"

namespace ckpt {
namespace {

TEST(CheckpointFuzzTest, CorruptedFilesAreErrorsOrCorrectData) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", "fuzz");
  ASSERT_TRUE(RemoveTree(dir).ok());
  ASSERT_TRUE(MakeDir(dir).ok());
  std::string w(6 * 5 * 4, '\0'), b(3 * 2, '\0');
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>(i * 13);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 7 + 1);
  CheckpointContents c;
  c.tensors = {{"w", DType::kF32, {6, 5}}, {"b", DType::kF16, {3}}};
  c.files = {{0, {{"w", Region{{0, 0}, {3, 5}, std::nullopt}, w.data(), 60}}},
             {1,
              {{"w", Region{{3, 0}, {3, 5}, FlatRange{0, 7}}, w.data() + 60, 28},
               {"w", Region{{3, 0}, {3, 5}, FlatRange{7, 15}}, w.data() + 88, 32},
               {"b", WholeRegion({3}), b.data(), 6}}}};
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, c, WriteOptions{});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> names = {"manifest.pb", m->files(0).name(), m->files(1).name()};
  std::vector<std::string> originals;
  for (const auto& n : names) originals.push_back(*ReadWholeFile(JoinPath(path, n), 1 << 20));

  std::mt19937 rng(2024);
  int errors = 0, clean = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const size_t which = rng() % names.size();
    std::string bytes = originals[which];
    const int flips = 1 + rng() % 3;
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    ASSERT_TRUE(WriteFileDurably(JoinPath(path, names[which]), bytes).ok());

    bool failed = false;
    auto reader = CheckpointReader::Open(path);
    if (!reader.ok()) {
      failed = true;
    } else {
      std::string got_w(w.size(), '\0'), got_b(b.size(), '\0');
      absl::Status sw = (*reader)->ReadRegion("w", WholeRegion({6, 5}), got_w.data());
      absl::Status sb = (*reader)->ReadRegion("b", WholeRegion({3}), got_b.data());
      // A read that succeeds returns exactly the saved bytes (checksums are verified).
      if (sw.ok()) {
        EXPECT_TRUE(got_w == w) << "iteration " << iter;
      }
      if (sb.ok()) {
        EXPECT_TRUE(got_b == b) << "iteration " << iter;
      }
      failed = !sw.ok() || !sb.ok();
    }
    (failed ? errors : clean)++;
    ASSERT_TRUE(WriteFileDurably(JoinPath(path, names[which]), originals[which]).ok());
  }
  EXPECT_GT(errors, 300);
}

}  // namespace
}  // namespace ckpt
