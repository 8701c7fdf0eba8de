// Executes one rank's part of a reshard on the cluster (pb::ReshardPlanPart): every piece of
// the rank's files is assembled from the source checkpoint's stored pieces (block-aligned,
// checksum-verified reads of only the bytes it needs) and the files are written into the
// coordinator's staging directory a wave at a time, within the part's memory budget (a third
// per wave being filled, a third for the wave being written, a third for source staging).
// No trainer is involved. The result is the rank's record of what it wrote, for the commit.
#ifndef CKPT_WORKER_RESHARD_EXECUTOR_H_
#define CKPT_WORKER_RESHARD_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// What one reshard part did.
struct ReshardPartStats {
  int64_t pieces = 0;
  int64_t files = 0;
  int64_t bytes_written = 0;
  int64_t bytes_read = 0;  // source bytes read (whole checksum blocks)
  double read_seconds = 0;
  double write_seconds = 0;
};

// Runs `part`; returns a serialized pb::Manifest holding the pieces and files written (the
// coordinator merges the ranks' records). `progress` receives the bytes written so far after
// each wave; `cancelled` is polled between waves. Errors name the rank, tensor, piece and file.
absl::StatusOr<std::string> ExecuteReshardPart(const pb::ReshardPlanPart& part,
                                               const std::function<void(int64_t)>& progress,
                                               const std::function<bool()>& cancelled,
                                               ReshardPartStats* stats);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_RESHARD_EXECUTOR_H_
