// WriteCheckpointInWaves on real files: a plan of several files written a bounded wave at a time
// (with and without overlapping fills), committed and read back; a failed fill commits nothing.
#include "reshard/wave_writer.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

constexpr int64_t kRows = 32, kCols = 64;  // 8 KiB of f32
constexpr int64_t kRowsPerPiece = 4;       // 1 KiB pieces, one per file

float Value(int64_t i, int64_t j) { return static_cast<float>(1000 * i + j); }

std::vector<TensorMeta> Tensors() { return {{"t", DType::kF32, {kRows, kCols}}}; }

// Writer 0 writes t in row blocks, one file each.
SavePlan RowBlockPlan() {
  SavePlan plan;
  plan.num_ranks = 1;
  WriterPlan writer;
  writer.rank = 0;
  for (int64_t k = 0; k < kRows / kRowsPerPiece; ++k) {
    PlannedPiece piece;
    piece.key = "t";
    piece.dtype = DType::kF32;
    piece.global_shape = {kRows, kCols};
    piece.region = Region{{k * kRowsPerPiece, 0}, {kRowsPerPiece, kCols}, std::nullopt};
    piece.size_bytes = kRowsPerPiece * kCols * 4;
    PlannedFile file;
    file.path = DataFileName(int64_t{0}, k);
    file.total_bytes = piece.size_bytes;
    file.pieces.push_back(piece);
    writer.total_bytes += file.total_bytes;
    writer.files.push_back(std::move(file));
  }
  plan.writers.push_back(std::move(writer));
  return plan;
}

// Fills each piece with its elements' values; counts the pieces filled.
WaveFill FillValues(int64_t* filled) {
  return [filled](absl::Span<const PlannedPiece* const> pieces,
                  absl::Span<char* const> buffers) -> absl::Status {
    for (size_t p = 0; p < pieces.size(); ++p) {
      const Region& r = pieces[p]->region;
      float* out = reinterpret_cast<float*>(buffers[p]);
      for (int64_t i = 0; i < r.lengths[0]; ++i) {
        for (int64_t j = 0; j < r.lengths[1]; ++j) {
          out[i * r.lengths[1] + j] = Value(r.offsets[0] + i, r.offsets[1] + j);
        }
      }
      ++*filled;
    }
    return absl::OkStatus();
  };
}

TEST(WaveWriterTest, WavesOfWholeFilesStayWithinTheirBytesAndCommitEveryElement) {
  const std::string dir = TestDir("wave_writer");
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "sequential");
    const std::string path = JoinPath(dir, overlap ? "overlapped" : "sequential");
    WaveOptions waves;
    waves.wave_bytes = 2048;  // two 1 KiB files per wave
    waves.overlap = overlap;
    std::vector<WaveProgress> progress;
    waves.progress = [&](const WaveProgress& p) { progress.push_back(p); };
    CheckpointContents info;
    info.step = 9;
    int64_t filled = 0;
    auto stats = WriteCheckpointInWaves(path, Tensors(), RowBlockPlan(), info, FillValues(&filled),
                                        waves, WriteOptions());
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->waves, 4);
    EXPECT_EQ(stats->files, 8);
    EXPECT_EQ(filled, 8);
    EXPECT_EQ(stats->bytes_written, kRows * kCols * 4);
    EXPECT_LE(stats->peak_wave_bytes, overlap ? 2 * waves.wave_bytes : waves.wave_bytes);
    EXPECT_EQ(stats->arena_allocations, overlap ? 2 : 1);  // reused by all four waves
    ASSERT_EQ(progress.size(), 4u);
    for (size_t w = 0; w < progress.size(); ++w) {
      EXPECT_EQ(progress[w].bytes_done, static_cast<int64_t>(w + 1) * 2048);
      EXPECT_EQ(progress[w].bytes_total, kRows * kCols * 4);
    }
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->manifest().step(), 9);
    std::vector<float> all(kRows * kCols);
    ASSERT_TRUE((*reader)->ReadRegion("t", WholeRegion({kRows, kCols}), all.data()).ok());
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j)
        ASSERT_EQ(all[i * kCols + j], Value(i, j)) << i << "," << j;
    }
  }
}

TEST(WaveWriterTest, FailedFillCommitsNothingAndLeavesNoStagingBehind) {
  const std::string dir = TestDir("wave_writer_fail");
  const std::string path = JoinPath(dir, "ckpt");
  int64_t filled = 0;
  WaveFill fill_then_fail = [&](absl::Span<const PlannedPiece* const> pieces,
                                absl::Span<char* const> buffers) -> absl::Status {
    if (filled >= 4) return absl::DataLossError("source piece t [8:12] is corrupt");
    return FillValues(&filled)(pieces, buffers);
  };
  WaveOptions waves;
  waves.wave_bytes = 2048;
  auto stats = WriteCheckpointInWaves(path, Tensors(), RowBlockPlan(), CheckpointContents(),
                                      fill_then_fail, waves, WriteOptions());
  ASSERT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
  EXPECT_TRUE(absl::StrContains(stats.status().message(), "source piece t [8:12] is corrupt"));
  EXPECT_FALSE(PathExists(path));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
}

TEST(WaveWriterTest, RepackForWavesRefusesAPieceLargerThanAWaveNamingIt) {
  SavePlan plan = RowBlockPlan();
  auto waves = RepackForWaves(&plan, 512);
  ASSERT_EQ(waves.status().code(), absl::StatusCode::kResourceExhausted) << waves.status();
  EXPECT_TRUE(absl::StrContains(waves.status().message(), "\"t\"") ||
              absl::StrContains(waves.status().message(), "t ["))
      << waves.status();
}

}  // namespace
}  // namespace ckpt
