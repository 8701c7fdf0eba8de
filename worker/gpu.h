// The worker's (and client's) few CUDA needs: how many GPUs this process sees, which one a
// local rank uses, and CUDA IPC handles for sharing device tensors between processes. With
// no GPU (or no driver) every call returns FailedPrecondition naming the CUDA error: a normal,
// reported condition.
#ifndef CKPT_WORKER_GPU_H_
#define CKPT_WORKER_GPU_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::worker {

// Number of CUDA devices; FailedPrecondition (with CUDA's message) when there are none.
absl::StatusOr<int> CudaDeviceCount();

// The GPU a local rank uses: local_rank modulo the device count (PhysicsNeMo's rule), or -1
// when this machine has no GPU.
int GpuForLocalRank(int local_rank);

// Exports a device allocation as a CUDA IPC handle (the bytes of cudaIpcMemHandle_t).
absl::StatusOr<std::string> ExportIpcHandle(void* device_ptr);

// Opens another process's device allocation on `device`; close with CloseIpcHandle.
absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device);
absl::Status CloseIpcHandle(void* device_ptr);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_GPU_H_
