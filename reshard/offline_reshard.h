// Offline resharding of a committed checkpoint into the pieces of a target layout, in-process
// and within a memory budget (ckptctl reshard without --coordinator).
//
// Plan: the target layout's pieces (planner/layout_spec.h) go through the planner's save
// plan (planner/save_plan.h: one writer per distinct main-replica piece, balanced over the
// target's ranks); the pieces are then cut, in shard-id order, into waves with one file per
// writer per wave (reshard/wave_writer.h, RepackForWaves), and the source pieces of the manifest
// map onto them with PlanReshard (sharding/reshard_plan.h). A wave's destination pieces are
// assembled in memory from the byte spans of the source pieces they need (checksum-block
// aligned reads through the parallel I/O engine, verified), then written (checksums computed as
// bytes stream out) into a staging directory that is committed atomically at the end. At most about
// `memory_budget_bytes` of piece data are held at once: a third for the wave being filled, a third
// for the wave being written meanwhile, a third for source staging.
#ifndef CKPT_RESHARD_OFFLINE_RESHARD_H_
#define CKPT_RESHARD_OFFLINE_RESHARD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/layout_spec.h"
#include "planner/save_plan.h"
#include "reshard/wave_writer.h"
#include "storage/checkpoint_writer.h"
#include "storage/io_engine.h"

namespace ckpt {

struct OfflineReshardOptions {
  int64_t memory_budget_bytes = int64_t{1} << 30;
  bool overlap = true;             // read/assemble the next wave while the previous one is written
  IoOptions io;                    // threads, queue depth, O_DIRECT for reads and writes
  bool overwrite = false;          // replace an existing committed checkpoint (only) at dst
  bool verify_checksums = true;    // verify source bytes against the manifest as they are read
  CompressionOptions compression;  // of the destination's pieces (storage/piece_codec.h)
  std::function<void(const WaveProgress&)> progress;
};

struct OfflineReshardStats {
  int64_t tensors = 0;
  int64_t src_pieces = 0;
  int64_t dst_pieces = 0;  // distinct pieces written
  int64_t bytes_read = 0;  // source bytes read (whole checksum blocks)
  int64_t peak_staging_bytes = 0;
  double plan_seconds = 0;
  double read_seconds = 0;
  WaveWriteStats write;
};

// Rewrites the checkpoint at `src` into the pieces of `layout` as a new checkpoint at `dst`
// (step and user metadata carried over, the target layout recorded as saved_layout). Errors
// name the tensor, piece and file involved; the destination is untouched on error.
absl::StatusOr<OfflineReshardStats> OfflineReshard(const std::string& src, const std::string& dst,
                                                   const LayoutSpec& layout,
                                                   const OfflineReshardOptions& options);

}  // namespace ckpt

#endif  // CKPT_RESHARD_OFFLINE_RESHARD_H_
