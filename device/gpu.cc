#include "device/gpu.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "device/cuda_status.h"

namespace ckpt {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    absl::Status s = CudaStatus(e, "cudaGetDeviceCount");
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", s.message()));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount reports 0 devices");
  }
  return count;
}

int GpuForLocalRank(int local_rank) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok() || local_rank < 0) return -1;
  return local_rank % *count;
}

absl::StatusOr<std::string> ExportIpcHandle(void* device_ptr) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  cudaIpcMemHandle_t handle;
  if (absl::Status s = CudaStatus(cudaIpcGetMemHandle(&handle, device_ptr), "cudaIpcGetMemHandle");
      !s.ok()) {
    return s;
  }
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC handle has ", handle.size(), " bytes, expected ", sizeof(cudaIpcMemHandle_t)));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  void* ptr = nullptr;
  if (absl::Status s = CudaStatus(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
                                  "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status CloseIpcHandle(void* device_ptr) {
  return CudaStatus(cudaIpcCloseMemHandle(device_ptr), "cudaIpcCloseMemHandle");
}

}  // namespace ckpt
