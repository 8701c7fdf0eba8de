// Executes a worker's part of a direct-read load: reads each region its trainer asked for
// straight from the checkpoint into the trainer's shared memory (checksums verified), whatever
// layout the checkpoint was saved from. No gRPC, no logging.
#ifndef CKPT_WORKER_LOAD_EXECUTOR_H_
#define CKPT_WORKER_LOAD_EXECUTOR_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_registry.h"

namespace ckpt::worker {

// Reads `part` into the session's tensors (read i targets tensor part.reads(i).local_index(),
// which must match its key and region). `progress(bytes_done)` is called after each tensor.
// Errors name the rank, tensor and checkpoint.
// `cancelled`, checked before each tensor, stops the load with Cancelled.
absl::Status ExecuteLoadPart(const pb::LoadPlanPart& part, const SessionInfo& session,
                             const std::function<void(int64_t bytes_done)>& progress = nullptr,
                             const std::function<bool()>& cancelled = nullptr);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_EXECUTOR_H_
