// The few CUDA needs of the worker, the client and the NCCL backend: how many GPUs this process
// sees, which one a local rank uses, and CUDA IPC handles for sharing device tensors between
// processes. With no GPU (or no driver) every call returns FailedPrecondition naming the CUDA
// error: a normal, reported condition. CUDA codes convert in device/cuda_status only.
#ifndef CKPT_DEVICE_GPU_H_
#define CKPT_DEVICE_GPU_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Number of CUDA devices; FailedPrecondition "no CUDA device: <CUDA's message>" when there
// are none.
absl::StatusOr<int> CudaDeviceCount();

// The GPU a local rank uses: local_rank modulo the device count (PhysicsNeMo's rule), or -1
// when this machine has no GPU.
int GpuForLocalRank(int local_rank);

// Exports a device allocation as a CUDA IPC handle (the bytes of cudaIpcMemHandle_t).
absl::StatusOr<std::string> ExportIpcHandle(void* device_ptr);

// Opens another process's device allocation on `device`; close with CloseIpcHandle.
absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device);
absl::Status CloseIpcHandle(void* device_ptr);

}  // namespace ckpt

#endif  // CKPT_DEVICE_GPU_H_
