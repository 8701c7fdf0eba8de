// Executes a worker's part of a direct-read load: reads each region its trainer asked for
// straight from the checkpoint into the trainer's shared memory (checksums verified), whatever
// layout the checkpoint was saved from. No gRPC, no logging.
#ifndef CKPT_WORKER_LOAD_EXECUTOR_H_
#define CKPT_WORKER_LOAD_EXECUTOR_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {

// Reads `part` into the session's tensors (read i targets tensor part.reads(i).local_index(),
// which must match its key and region). `progress(bytes_done)` is called after each tensor.
// Errors name the rank, tensor and checkpoint.
// Every read into the trainer's memory goes through `gate`, a chunk (kReadChunkBytes) at a
// time: once the gate closed (the operation was aborted) the load stops with its reason.
// Device tensors are read chunk by chunk into the worker's pinned pool `staging` and copied to
// the device from there (the next chunk is read while the previous one is copied); without a
// pool they are FailedPrecondition.
absl::Status ExecuteLoadPart(const pb::LoadPlanPart& part, const SessionInfo& session,
                             MemoryGate& gate,
                             const std::function<void(int64_t bytes_done)>& progress = nullptr,
                             PinnedStagingPool* staging = nullptr);

// Copies `host` (the tensor's bytes, e.g. assembled by an exchange) onto the device tensor
// `tensor` through `staging`, inside `gate`. Errors name `who` and the tensor.
absl::Status CopyOntoDevice(const RegisteredTensor& tensor, const char* host,
                            PinnedStagingPool* staging, MemoryGate& gate, const std::string& who);

// Bytes of one read into trainer memory (a multiple of storage's 4 MiB checksum blocks, so a
// contiguous region re-reads little at chunk boundaries).
inline constexpr int64_t kReadChunkBytes = int64_t{64} << 20;

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_EXECUTOR_H_
