// PieceAssembler and PiecesOfManifest on a real committed checkpoint (written by storage/):
// destination pieces that cut across the stored pieces are filled from every source piece they
// overlap, in batches bounded by the staging cap, and corrupt bytes are refused.
#include "reshard/piece_assembler.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "sharding/reshard_plan.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

// 12 KiB of f32 in two 6 KiB stored pieces: each spans two 4 KiB checksum blocks.
constexpr int64_t kRows = 64, kCols = 48;
constexpr int64_t kBlock = 4096;

// w[i][j] = 100 * i + j, stored as two row halves in two files.
const std::vector<float>& Values() {
  static const std::vector<float> w = [] {
    std::vector<float> v(kRows * kCols);
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) v[i * kCols + j] = static_cast<float>(100 * i + j);
    }
    return v;
  }();
  return w;
}

std::vector<float> Box(int64_t row, int64_t rows, int64_t col, int64_t cols) {
  std::vector<float> out;
  for (int64_t i = row; i < row + rows; ++i) {
    for (int64_t j = col; j < col + cols; ++j) out.push_back(Values()[i * kCols + j]);
  }
  return out;
}

TensorPiece Dst(int64_t row, int64_t rows, int64_t col, int64_t cols) {
  return TensorPiece{"w", 0, DType::kF32, {kRows, kCols}, Region{{row, col}, {rows, cols}, {}}, {}};
}

class PieceAssemblerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = JoinPath(TestDir("piece_assembler"), "src");
    const std::vector<float>& w = Values();
    const int64_t half = kRows / 2 * kCols;
    CheckpointContents contents;
    contents.tensors = {{"w", DType::kF32, {kRows, kCols}}};
    contents.files = {
        {0, {{"w", Region{{0, 0}, {kRows / 2, kCols}, std::nullopt}, w.data(), half * 4}}},
        {1,
         {{"w", Region{{kRows / 2, 0}, {kRows / 2, kCols}, std::nullopt}, w.data() + half,
           half * 4}}}};
    WriteOptions options;
    options.checksum_block_bytes = kBlock;  // the smallest allowed: spans are block-aligned
    auto written = WriteCheckpoint(src_, contents, options);
    ASSERT_TRUE(written.ok()) << written.status();
    auto reader = CheckpointReader::Open(src_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    auto pieces = PiecesOfManifest(reader_->manifest());
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    src_pieces_ = pieces->pieces;
  }

  std::string src_;
  std::unique_ptr<CheckpointReader> reader_;
  std::vector<TensorPiece> src_pieces_;
};

TEST_F(PieceAssemblerTest, PiecesAcrossStoredPiecesAreFilledWithinTheStagingCap) {
  ASSERT_EQ(src_pieces_.size(), 2u);
  // Column thirds (each needs both stored halves) and a box straddling the halves.
  const std::vector<TensorPiece> dst = {Dst(0, kRows, 0, 16), Dst(0, kRows, 16, 16),
                                        Dst(0, kRows, 32, 16), Dst(30, 4, 5, 20)};
  auto plan = PlanReshard(src_pieces_, dst);
  ASSERT_TRUE(plan.ok()) << plan.status();
  constexpr int64_t kCap = kBlock;
  PieceAssembler assembler(*reader_, src_pieces_, dst, *plan, kCap);
  std::vector<std::vector<float>> out = {
      std::vector<float>(kRows * 16), std::vector<float>(kRows * 16),
      std::vector<float>(kRows * 16), std::vector<float>(4 * 20)};
  std::vector<char*> buffers;
  for (auto& b : out) buffers.push_back(reinterpret_cast<char*>(b.data()));
  // Two calls, as a wave writer makes them.
  ASSERT_TRUE(assembler.Fill({0, 1}, {buffers[0], buffers[1]}).ok());
  ASSERT_TRUE(assembler.Fill({2, 3}, {buffers[2], buffers[3]}).ok());
  EXPECT_EQ(out[0], Box(0, kRows, 0, 16));
  EXPECT_EQ(out[1], Box(0, kRows, 16, 16));
  EXPECT_EQ(out[2], Box(0, kRows, 32, 16));
  EXPECT_EQ(out[3], Box(30, 4, 5, 20));
  EXPECT_GT(assembler.stats().bytes_read, 0);
  // At most the cap, plus one checksum block per slot for a span that straddles it.
  EXPECT_LE(assembler.stats().peak_staging_bytes, kCap + 2 * kBlock);
}

TEST_F(PieceAssemblerTest, AStagingCapBelowOneWaveGivesTheSameBytesFromTwoReusedSlots) {
  // Two waves of two pieces that tile the tensor, as a layout's pieces do.
  const std::vector<TensorPiece> dst = {Dst(0, kRows, 0, 16), Dst(0, kRows, 16, 32),
                                        Dst(0, 30, 0, kCols), Dst(30, kRows - 30, 0, kCols)};
  auto plan = PlanReshard(src_pieces_, dst);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<std::vector<float>> expected = {Box(0, kRows, 0, 16), Box(0, kRows, 16, 32),
                                                    Box(0, 30, 0, kCols),
                                                    Box(30, kRows - 30, 0, kCols)};
  // Waves of 12 KiB against staging of one block per slot, overlapped or not: the same
  // bytes, many batches, and each slot allocated once across both Fill calls.
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "alternating");
    PieceAssembler assembler(*reader_, src_pieces_, dst, *plan, 2 * kBlock, overlap);
    std::vector<std::vector<float>> out;
    std::vector<char*> buffers;
    for (const auto& e : expected) out.emplace_back(e.size(), -1.0f);
    for (auto& b : out) buffers.push_back(reinterpret_cast<char*>(b.data()));
    ASSERT_TRUE(assembler.Fill({0, 1}, {buffers[0], buffers[1]}).ok());
    ASSERT_TRUE(assembler.Fill({2, 3}, {buffers[2], buffers[3]}).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i].size(), expected[i].size());
      for (size_t k = 0; k < out[i].size(); ++k) {
        ASSERT_EQ(out[i][k], expected[i][k]) << "piece " << i << " element " << k;
      }
    }
    EXPECT_GE(assembler.stats().batches, 6);
    EXPECT_LE(assembler.stats().staging_allocations, 2);
    EXPECT_LE(assembler.stats().peak_staging_bytes, 2 * kBlock);
  }
}

TEST_F(PieceAssemblerTest, CorruptStoredBytesAreDataLossNamingTheFile) {
  const pb::StoredPiece& piece = reader_->manifest().pieces(1);
  const std::string file = JoinPath(src_, piece.file());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    f.seekg(piece.byte_offset() + 5000);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(piece.byte_offset() + 5000);
    f.write(&c, 1);
  }
  const std::vector<TensorPiece> dst = {Dst(0, kRows, 0, kCols)};
  auto plan = PlanReshard(src_pieces_, dst);
  ASSERT_TRUE(plan.ok()) << plan.status();
  PieceAssembler assembler(*reader_, src_pieces_, dst, *plan, 1 << 20);
  std::vector<float> out(kRows * kCols);
  absl::Status s = assembler.Fill({0}, {reinterpret_cast<char*>(out.data())});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), piece.file())) << s;
}

TEST_F(PieceAssemblerTest, ManifestPieceOfAnUnknownTensorIsRefusedNamingIt) {
  pb::Manifest manifest = reader_->manifest();
  manifest.mutable_pieces(0)->set_key("ghost");
  auto pieces = PiecesOfManifest(manifest);
  ASSERT_EQ(pieces.status().code(), absl::StatusCode::kInvalidArgument) << pieces.status();
  EXPECT_TRUE(absl::StrContains(pieces.status().message(), "ghost")) << pieces.status();
}

}  // namespace
}  // namespace ckpt
