// Executes a worker's part of a save: writes the pieces the plan assigned to this rank, straight
// from the trainer's shared memory, into the save's staging directory (storage's safetensors
// data files, fsynced), and returns the record of what it wrote for the coordinator's commit.
// No gRPC, no logging.
#ifndef CKPT_WORKER_SAVE_EXECUTOR_H_
#define CKPT_WORKER_SAVE_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_registry.h"

namespace ckpt::worker {

// Writes `part` for the rank whose registered state is `session` (piece i of a file is the
// session's tensor part.files(f).pieces(i).local_index(), which must match its key and region).
// Returns a serialized pb::Manifest holding the written pieces and files. Errors name the
// rank, tensor key and file.
// `progress(bytes_done)` is called after each data file is written and synced.
absl::StatusOr<std::string> ExecuteSavePart(
    const pb::SavePlanPart& part, const SessionInfo& session,
    const std::function<void(int64_t bytes_done)>& progress = nullptr);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SAVE_EXECUTOR_H_
