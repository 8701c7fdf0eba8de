// Writing a checkpoint a wave of whole data files at a time, so that only a bounded amount
// of piece data is in memory: the caller fills each wave's piece buffers (from a generator, or
// from another checkpoint for a reshard) while the previous wave is written, and the whole is
// committed atomically at the end (storage/checkpoint_writer.h's protocol in parts).
#ifndef CKPT_RESHARD_WAVE_WRITER_H_
#define CKPT_RESHARD_WAVE_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/save_plan.h"
#include "storage/checkpoint_writer.h"

namespace ckpt {

// Progress of a wave-by-wave write, reported after each wave.
struct WaveProgress {
  int64_t wave = 0;
  int64_t waves = 0;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
};

// What a wave-by-wave write did.
struct WaveWriteStats {
  int64_t waves = 0;
  int64_t files = 0;
  int64_t pieces = 0;
  int64_t bytes_written = 0;      // piece bytes (headers excluded)
  int64_t peak_wave_bytes = 0;    // destination buffers held at once (both arenas when overlapped)
  int64_t arena_allocations = 0;  // arenas allocated: each once, at the largest wave's size
  double fill_seconds = 0;        // in the fill callback (reads + assembly for a reshard)
  double write_seconds = 0;       // writing and syncing data files (overlaps fills when overlapped)
  double commit_seconds = 0;
};

// Fills the buffers of one wave's pieces (buffers[i] has pieces[i]->size_bytes bytes, in the
// storage convention of sharding/overlap.h). Always called from the caller's thread.
using WaveFill = std::function<absl::Status(absl::Span<const PlannedPiece* const> pieces,
                                            absl::Span<char* const> buffers)>;

struct WaveOptions {
  // Destination piece bytes per wave (a file larger than this forms a wave of its own).
  int64_t wave_bytes = int64_t{256} << 20;
  // Fill wave k + 1 while wave k is written (two waves' buffers in memory at once).
  bool overlap = true;
  std::function<void(const WaveProgress&)> progress;  // after each wave is written
};

// Writes the checkpoint of `plan` at `path` with the commit protocol, a wave of whole files
// at a time. Files are taken in the order of their first piece's shard id so that a wave holds
// neighbouring tensors. `info` supplies saved layout, step and user metadata (its `tensors` and
// `files` are ignored). Data file names are those of the plan. On error nothing is committed
// and the staging directory is removed.
absl::StatusOr<WaveWriteStats> WriteCheckpointInWaves(
    const std::string& path, const std::vector<TensorMeta>& tensors, const SavePlan& plan,
    const CheckpointContents& info, const WaveFill& fill, const WaveOptions& wave_options,
    const WriteOptions& options);

// The wave loop of WriteCheckpointInWaves without the commit: writes the plan's files into the
// existing staging directory `staging` (e.g. one rank's files of a reshard executed on a
// cluster) and returns their manifest records. On error the files written so far stay for the
// caller to remove with the staging directory.
absl::StatusOr<WrittenData> WriteFilesInWaves(const std::string& staging,
                                              const std::vector<TensorMeta>& tensors,
                                              const SavePlan& plan, const WaveFill& fill,
                                              const WaveOptions& wave_options,
                                              const WriteOptions& options, WaveWriteStats* stats);

// Re-packs the plan's pieces (keeping each piece's writer) for writing in waves of at most
// `wave_bytes`: all pieces in shard-id order are cut into consecutive waves, and in wave k
// every writer gets one file "data/r<rank>_<k>.safetensors" (empty when it has nothing there;
// WriteCheckpointInWaves skips empty files). WriteCheckpointInWaves with the same wave_bytes
// then writes exactly these waves, each covering a contiguous range of tensors, so a reshard
// reads a source piece in one wave (two at a wave boundary). Returns the number of waves;
// ResourceExhausted names a piece larger than wave_bytes.
absl::StatusOr<int64_t> RepackForWaves(SavePlan* plan, int64_t wave_bytes);

}  // namespace ckpt

#endif  // CKPT_RESHARD_WAVE_WRITER_H_
