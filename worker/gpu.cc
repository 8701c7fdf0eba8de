#include "worker/gpu.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {
namespace {

absl::Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": CUDA ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(absl::StrCat(message, " (no usable GPU on this host)"));
  }
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    absl::Status s = FromCuda(e, "cudaGetDeviceCount");
    return absl::FailedPreconditionError(s.message());
  }
  if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount: 0 CUDA devices");
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
  if (absl::Status s = FromCuda(cudaIpcGetMemHandle(&handle, device_ptr), "cudaIpcGetMemHandle");
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
  if (absl::Status s = FromCuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  void* ptr = nullptr;
  if (absl::Status s = FromCuda(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
                                "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status CloseIpcHandle(void* device_ptr) {
  return FromCuda(cudaIpcCloseMemHandle(device_ptr), "cudaIpcCloseMemHandle");
}

}  // namespace ckpt::worker
