// ExecuteReshardPart on real files: a committed source checkpoint written by storage/, the part's
// files written into a real staging directory, and the returned record committed with the same
// storage calls the coordinator's reshard commit uses, then read back.
#include "worker/reshard_executor.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/save_plan.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kRows = 8, kCols = 6;

// w[i][j] = 100 * i + j.
std::vector<float> Values() {
  std::vector<float> w(kRows * kCols);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kCols; ++j) w[i * kCols + j] = static_cast<float>(100 * i + j);
  }
  return w;
}

std::vector<TensorMeta> Tensors() { return {{"w", DType::kF32, {kRows, kCols}}}; }

// The source: w stored as two row halves, in two files of writer 0.
void WriteSource(const std::string& path) {
  static const std::vector<float> w = Values();
  CheckpointContents contents;
  contents.tensors = Tensors();
  contents.step = 3;
  const int64_t half = kRows / 2 * kCols;
  contents.files = {
      {0, {{"w", Region{{0, 0}, {kRows / 2, kCols}, std::nullopt}, w.data(), half * 4}}},
      {0,
       {{"w", Region{{kRows / 2, 0}, {kRows / 2, kCols}, std::nullopt}, w.data() + half,
         half * 4}}}};
  auto written = WriteCheckpoint(path, contents, WriteOptions());
  ASSERT_TRUE(written.ok()) << written.status();
}

pb::PlanPiece Piece(int64_t row, int64_t rows, int64_t col, int64_t cols) {
  pb::PlanPiece p;
  p.set_key("w");
  p.set_dtype(DTypeToProto(DType::kF32));
  p.add_global_shape(kRows);
  p.add_global_shape(kCols);
  *p.mutable_region() = RegionToProto(Region{{row, col}, {rows, cols}, std::nullopt});
  p.set_size_bytes(rows * cols * 4);
  return p;
}

class ReshardExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir("reshard_executor");
    src_ = JoinPath(dir_, "src");
    ASSERT_NO_FATAL_FAILURE(WriteSource(src_));
    dst_ = JoinPath(dir_, "dst");
    auto staging = CreateStagingDir(dst_, /*overwrite=*/false);
    ASSERT_TRUE(staging.ok()) << staging.status();
    staging_ = *staging;
    part_.set_rank(1);
    part_.set_source(src_);
    part_.set_staging_dir(staging_);
    part_.set_memory_budget_bytes(1 << 20);
  }
  pb::PlanFile* AddFile() {
    pb::PlanFile* f = part_.add_files();
    f->set_path(DataFileName(int64_t{part_.rank()}, int64_t{part_.files_size() - 1}));
    return f;
  }

  std::string dir_, src_, dst_, staging_;
  pb::ReshardPlanPart part_;
};

TEST_F(ReshardExecutorTest, PiecesAreAssembledAcrossSourcePiecesAndTheRecordCommitsToTheirBytes) {
  // Columns 0-2 of every row (from both source halves) in one file; in a second file, rows 2-5
  // of columns 3-5 (straddling the two source pieces) and the rest of those columns.
  *AddFile()->add_pieces() = Piece(0, kRows, 0, 3);
  pb::PlanFile* second = AddFile();
  *second->add_pieces() = Piece(2, 4, 3, 3);
  *second->add_pieces() = Piece(0, 2, 3, 3);
  *second->add_pieces() = Piece(6, 2, 3, 3);
  std::vector<int64_t> progress;
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(
      part_, [&](int64_t bytes) { progress.push_back(bytes); }, nullptr, &stats);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(stats.pieces, 4);
  EXPECT_EQ(stats.files, 2);
  EXPECT_GT(stats.bytes_read, 0);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), kRows * kCols * 4);

  pb::Manifest written;
  ASSERT_TRUE(written.ParseFromString(*record));
  ASSERT_EQ(written.pieces_size(), 4);
  ASSERT_EQ(written.files_size(), 2);
  EXPECT_EQ(written.files(0).name(), DataFileName(int64_t{1}, int64_t{0}));

  // Commit the record as the coordinator would, then read the pieces back.
  WrittenData data;
  data.pieces.assign(written.pieces().begin(), written.pieces().end());
  data.files.assign(written.files().begin(), written.files().end());
  CheckpointContents info;
  info.step = 3;
  pb::Manifest manifest = BuildManifest(Tensors(), data, info, kDefaultChecksumBlockBytes);
  absl::Status committed = CommitCheckpoint(staging_, dst_, manifest, WriteOptions());
  ASSERT_TRUE(committed.ok()) << committed;
  auto reader = CheckpointReader::Open(dst_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> all(kRows * kCols);
  ASSERT_TRUE(
      (*reader)->ReadRegion("w", Region{{0, 0}, {kRows, kCols}, std::nullopt}, all.data()).ok());
  EXPECT_EQ(all, Values());
}

TEST_F(ReshardExecutorTest, PartWithoutFilesWritesNothingAndRecordsNothing) {
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(part_, nullptr, nullptr, &stats);
  ASSERT_TRUE(record.ok()) << record.status();
  pb::Manifest written;
  ASSERT_TRUE(written.ParseFromString(*record));
  EXPECT_EQ(written.pieces_size(), 0);
  EXPECT_EQ(written.files_size(), 0);
  EXPECT_EQ(stats.bytes_read, 0);
}

TEST_F(ReshardExecutorTest, FileNotNamedForItsRankAndIndexIsRefusedNamingBothNames) {
  pb::PlanFile* f = AddFile();
  f->set_path("data/r0_7.safetensors");
  *f->add_pieces() = Piece(0, 1, 0, 1);
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(part_, nullptr, nullptr, &stats);
  ASSERT_EQ(record.status().code(), absl::StatusCode::kInvalidArgument) << record.status();
  EXPECT_TRUE(absl::StrContains(record.status().message(), "reshard rank 1"));
  EXPECT_TRUE(absl::StrContains(record.status().message(), "data/r0_7.safetensors"));
  EXPECT_TRUE(absl::StrContains(record.status().message(), DataFileName(int64_t{1}, int64_t{0})));
}

TEST_F(ReshardExecutorTest, PieceWhoseSizeDisagreesWithItsRegionIsRefusedNamingTheTensor) {
  pb::PlanPiece piece = Piece(0, 2, 0, 2);
  piece.set_size_bytes(15);
  *AddFile()->add_pieces() = piece;
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(part_, nullptr, nullptr, &stats);
  ASSERT_EQ(record.status().code(), absl::StatusCode::kInvalidArgument) << record.status();
  EXPECT_TRUE(absl::StrContains(record.status().message(), "tensor \"w\""));
  EXPECT_TRUE(absl::StrContains(record.status().message(), "declares 15 bytes"));
}

TEST_F(ReshardExecutorTest, MissingSourceCheckpointIsNamed) {
  part_.set_source(JoinPath(dir_, "no_such_checkpoint"));
  *AddFile()->add_pieces() = Piece(0, 1, 0, 1);
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(part_, nullptr, nullptr, &stats);
  ASSERT_FALSE(record.ok());
  EXPECT_TRUE(absl::StrContains(record.status().message(), "source checkpoint")) << record.status();
  EXPECT_TRUE(absl::StrContains(record.status().message(), "no_such_checkpoint"))
      << record.status();
}

TEST_F(ReshardExecutorTest, CorruptSourceBytesAreDataLoss) {
  // Flip the last byte of the second source file (tensor data, not the header).
  const std::string file = JoinPath(src_, DataFileName(int64_t{0}, int64_t{1}));
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  f.seekg(-1, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(-1, std::ios::end);
  f.write(&c, 1);
  f.close();
  *AddFile()->add_pieces() = Piece(0, kRows, 0, kCols);
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(part_, nullptr, nullptr, &stats);
  ASSERT_EQ(record.status().code(), absl::StatusCode::kDataLoss) << record.status();
  EXPECT_TRUE(absl::StrContains(record.status().message(), "reshard rank 1")) << record.status();
}

TEST_F(ReshardExecutorTest, AbortSeenBetweenWavesStopsThePartAsCancelled) {
  *AddFile()->add_pieces() = Piece(0, kRows, 0, kCols);
  ReshardPartStats stats;
  auto record = ExecuteReshardPart(
      part_, nullptr, [] { return true; }, &stats);
  ASSERT_EQ(record.status().code(), absl::StatusCode::kCancelled) << record.status();
  EXPECT_TRUE(absl::StrContains(record.status().message(), "aborted")) << record.status();
}

}  // namespace
}  // namespace ckpt::worker
