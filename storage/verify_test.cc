#include "storage/verify.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/overlap.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// Brute force: count how many pieces store each element (flat index into the tensor).
bool ExactlyOnceBruteForce(const std::vector<Region>& pieces, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int> count(n, 0);
  for (const Region& r : pieces) {
    const int nd = r.ndim();
    std::vector<int64_t> idx(nd, 0);
    for (int64_t i = 0; i < r.BoxElements(); ++i) {
      if (!r.flat || (i >= r.flat->start && i < r.flat->stop)) {
        int64_t g = 0;
        for (int d = 0; d < nd; ++d) g = g * shape[d] + r.offsets[d] + idx[d];
        ++count[g];
      }
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < r.lengths[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (int c : count) {
    if (c != 1) return false;
  }
  return true;
}

pb::Manifest ManifestOf(const std::vector<Region>& pieces, const std::vector<int64_t>& shape) {
  pb::Manifest m;
  auto* t = m.add_tensors();
  t->set_key("t");
  t->set_dtype(pb::DTYPE_U8);
  for (int64_t d : shape) t->add_global_shape(d);
  for (const Region& r : pieces) {
    auto* p = m.add_pieces();
    p->set_key("t");
    *p->mutable_region() = RegionToProto(r);
  }
  return m;
}

// Random tilings (rows split into boxes, some boxes split into flat ranges), sometimes
// perturbed by dropping or duplicating a piece or shifting a boundary.
TEST(VerifyTest, CoverageCheckAgreesWithBruteForce) {
  std::mt19937 rng(17);
  int sound = 0, broken = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const std::vector<int64_t> shape = {1 + static_cast<int64_t>(rng() % 6),
                                        1 + static_cast<int64_t>(rng() % 5)};
    std::vector<Region> pieces;
    for (int64_t row = 0; row < shape[0];) {
      const int64_t rows = 1 + rng() % (shape[0] - row);
      Region box{{row, 0}, {rows, shape[1]}, std::nullopt};
      if (rng() % 2) {
        const int64_t n = box.BoxElements(), cut = rng() % (n + 1);
        Region a = box, b = box;
        a.flat = FlatRange{0, cut};
        b.flat = FlatRange{cut, n};
        pieces.push_back(a);
        pieces.push_back(b);
      } else {
        pieces.push_back(box);
      }
      row += rows;
    }
    switch (rng() % 4) {
      case 0:
        pieces.erase(pieces.begin() + rng() % pieces.size());
        break;
      case 1:
        pieces.push_back(pieces[rng() % pieces.size()]);
        break;
      case 2: {
        Region& r = pieces[rng() % pieces.size()];
        if (r.flat && r.flat->stop > r.flat->start) --r.flat->stop;
        break;
      }
      default:
        break;
    }
    auto problems = CheckCoverage(ManifestOf(pieces, shape));
    ASSERT_TRUE(problems.ok()) << problems.status();
    const bool exact = ExactlyOnceBruteForce(pieces, shape);
    EXPECT_EQ(problems->empty(), exact) << "iteration " << iter;
    (exact ? sound : broken)++;
  }
  EXPECT_GT(sound, 100);
  EXPECT_GT(broken, 100);
}

TEST(VerifyTest, ScalarNeedsExactlyOnePiece) {
  EXPECT_TRUE(CheckCoverage(ManifestOf({Region{}}, {}))->empty());
  EXPECT_FALSE(CheckCoverage(ManifestOf({}, {}))->empty());
  EXPECT_FALSE(CheckCoverage(ManifestOf({Region{}, Region{}}, {}))->empty());
  EXPECT_TRUE(CheckCoverage(ManifestOf({}, {0, 3}))->empty());  // nothing to store
}

// A checkpoint of two tensors, "w" (40 x 8 F32, one piece per row) and "b" (8 I32), over three
// data files; its manifest in piece files when `split`.
struct Written {
  std::vector<float> w = std::vector<float>(40 * 8);
  std::vector<int32_t> b = std::vector<int32_t>(8);
  pb::Manifest manifest;

  absl::Status Write(const std::string& path, bool split) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>(i * 7);
    CheckpointContents c;
    c.tensors = {{"w", DType::kF32, {40, 8}}, {"b", DType::kI32, {8}}};
    c.files.resize(3);
    for (int f = 0; f < 3; ++f) c.files[f].writer_rank = f;
    for (int r = 0; r < 40; ++r) {
      c.files[r % 3].pieces.push_back(
          {"w", Region{{r, 0}, {1, 8}, std::nullopt}, w.data() + r * 8, 32});
    }
    c.files[2].pieces.push_back({"b", WholeRegion({8}), b.data(), 32});
    WriteOptions options;
    if (split) {
      options.manifest_files.max_single_file_bytes = 1024;
      options.manifest_files.piece_file_bytes = 700;
    }
    absl::StatusOr<pb::Manifest> m = WriteCheckpoint(path, c, options);
    if (m.ok()) manifest = *std::move(m);
    return m.status();
  }
};

// Batches of a few pieces (a 100-byte budget) verify every byte, for both manifest formats.
TEST(VerifyCheckpointTest, SoundCheckpointVerifiesInSmallBatches) {
  const std::string dir = TestDir("verify-sound");
  for (bool split : {false, true}) {
    const std::string path = JoinPath(dir, split ? "split" : "single");
    Written written;
    ASSERT_TRUE(written.Write(path, split).ok());
    for (int64_t budget : {int64_t{100}, int64_t{256} << 20}) {
      absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions(), budget);
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_TRUE(report->problems.empty()) << report->problems[0];
      EXPECT_EQ(report->tensors, 2);
      EXPECT_EQ(report->pieces, 41);
      EXPECT_EQ(report->files, 3);
      EXPECT_EQ(report->manifest_piece_files > 0, split);
      EXPECT_EQ(report->bytes_checked, 40 * 32 + 32);
    }
  }
}

// A flipped data byte is a problem naming its entry; the other batches are still read.
TEST(VerifyCheckpointTest, CorruptedPieceIsAProblemNamingItsEntry) {
  const std::string dir = TestDir("verify-corrupt");
  const std::string path = JoinPath(dir, "ckpt");
  Written written;
  ASSERT_TRUE(written.Write(path, /*split=*/true).ok());
  pb::StoredPiece row7;
  for (const pb::StoredPiece& p : written.manifest.pieces()) {
    if (p.entry_name() == "w|7:8,0:8") row7 = p;
  }
  ASSERT_EQ(row7.entry_name(), "w|7:8,0:8");
  const std::string file = JoinPath(path, row7.file());
  std::string bytes = *ReadWholeFile(file, 1 << 20);
  bytes[row7.byte_offset() + 5] ^= 1;
  ASSERT_TRUE(WriteFileDurably(file, bytes).ok());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions(), 100);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_THAT(report->problems[0], HasSubstr("entry \"w|7:8,0:8\""));
  EXPECT_EQ(report->bytes_checked, 40 * 32);
}

// Files at the top of the directory that are not manifest.pb, data/ or a listed piece file,
// and unlisted files in data/, are each a problem naming them.
TEST(VerifyCheckpointTest, FilesThatAreNotPartOfTheCheckpointAreProblems) {
  const std::string dir = TestDir("verify-foreign");
  const std::string path = JoinPath(dir, "ckpt");
  Written written;
  ASSERT_TRUE(written.Write(path, /*split=*/true).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "notes.txt"), "x").ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, ManifestPieceFileName(90)), "x").ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "data/r9_0.safetensors"), "x").ok());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->problems.size(), 3u);
  EXPECT_THAT(report->problems[0],
              HasSubstr(JoinPath(path, ManifestPieceFileName(90)) + " is not part of the"));
  EXPECT_THAT(report->problems[1], HasSubstr(JoinPath(path, "notes.txt") + " is not part of the"));
  EXPECT_THAT(report->problems[2],
              HasSubstr(JoinPath(path, "data/r9_0.safetensors") + " is not listed"));
}

// A data file whose header holds an entry no piece of the manifest names (here: "b", dropped
// from the manifest with its tensor) fails verification naming the file.
TEST(VerifyCheckpointTest, HeaderEntryTheManifestDoesNotListIsAnError) {
  const std::string dir = TestDir("verify-unlisted-entry");
  const std::string path = JoinPath(dir, "ckpt");
  Written written;
  ASSERT_TRUE(written.Write(path, /*split=*/false).ok());
  pb::Manifest m = written.manifest;
  ASSERT_EQ(m.tensors(1).key(), "b");
  m.mutable_tensors()->RemoveLast();
  m.clear_pieces();
  for (const pb::StoredPiece& p : written.manifest.pieces()) {
    if (p.key() == "w") *m.add_pieces() = p;
  }
  ASSERT_EQ(m.pieces_size(), 40);
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), SerializeManifest(m)).ok());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss) << report.status();
  EXPECT_THAT(report.status().message(),
              HasSubstr("data file data/r2_0.safetensors: its header has 14 entries; the "
                        "manifest lists 13 pieces in it"));
}

// Unverifiable checkpoints are errors: missing, incomplete, an invalid manifest (a hole).
TEST(VerifyCheckpointTest, MissingIncompleteAndInvalidCheckpointsAreErrors) {
  const std::string dir = TestDir("verify-errors");
  EXPECT_EQ(VerifyCheckpoint(JoinPath(dir, "none"), IoOptions()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(MakeDir(JoinPath(dir, "half")).ok());
  EXPECT_EQ(VerifyCheckpoint(JoinPath(dir, "half"), IoOptions()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string path = JoinPath(dir, "ckpt");
  Written written;
  ASSERT_TRUE(written.Write(path, /*split=*/true).ok());
  pb::Manifest m = written.manifest;
  m.mutable_pieces()->DeleteSubrange(3, 1);
  ASSERT_TRUE(WriteManifestFiles(path, "manifest.pb", m, ManifestFileOptions()).ok());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss) << report.status();
  EXPECT_THAT(report.status().message(), HasSubstr("stored by no piece"));
}

}  // namespace
}  // namespace ckpt
