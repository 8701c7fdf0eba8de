#include "device/gpu.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "device/cuda_status.h"
#include "device/device_uuid.h"

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

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);

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

absl::Status CopyHostToDevice(void* device_ptr, int device, const void* host, size_t bytes) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(device_ptr, host, bytes, cudaMemcpyHostToDevice),
                    "cudaMemcpy host to device");
}

absl::Status CopyDeviceToHost(void* host, const void* device_ptr, int device, size_t bytes) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(host, device_ptr, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy device to host");
}

namespace {

// A driver API function, reached through the runtime (so nothing links libcuda.so, which a
// machine without a GPU driver lacks).
template <typename Fn>
absl::StatusOr<Fn> DriverFunction(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  absl::Status s = CudaStatus(
      cudaGetDriverEntryPointByVersion(symbol, &fn, CUDA_VERSION, cudaEnableDefault, &found),
      absl::StrCat("cudaGetDriverEntryPoint(", symbol, ")"));
  if (!s.ok()) return s;
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver does not provide ", symbol, " (driver too old?)"));
  }
  return reinterpret_cast<Fn>(fn);
}

}  // namespace

absl::StatusOr<ExportedAllocation> ExportDeviceAllocation(const void* device_ptr) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  cudaPointerAttributes attributes;
  if (absl::Status s =
          CudaStatus(cudaPointerGetAttributes(&attributes, device_ptr), "cudaPointerGetAttributes");
      !s.ok()) {
    return s;
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("pointer ", absl::Hex(reinterpret_cast<uintptr_t>(device_ptr)),
                     " is not device memory (CUDA memory type ", static_cast<int>(attributes.type),
                     "); register host and managed memory as host tensors"));
  }
  using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  using PointerAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  absl::StatusOr<AddressRangeFn> address_range =
      DriverFunction<AddressRangeFn>("cuMemGetAddressRange");
  if (!address_range.ok()) return address_range.status();
  absl::StatusOr<PointerAttributeFn> pointer_attribute =
      DriverFunction<PointerAttributeFn>("cuPointerGetAttribute");
  if (!pointer_attribute.ok()) return pointer_attribute.status();
  const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(device_ptr);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (absl::Status s =
          CudaDriverStatus((*address_range)(&base, &size, ptr), "cuMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  int ipc_capable = 0;
  if (absl::Status s = CudaDriverStatus(
          (*pointer_attribute)(&ipc_capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr),
          "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)");
      !s.ok()) {
    return s;
  }
  if (ipc_capable == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the allocation at ", absl::Hex(base), " (", size, " bytes) on device ", attributes.device,
        " was made with CUDA's virtual memory API or from a memory pool (cuMemCreate, "
        "cudaMallocAsync; PyTorch's expandable_segments) and cannot be exported with "
        "cudaIpcGetMemHandle; such allocations are refused: run the trainer with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (and no cudaMallocAsync backend), or "
        "register a host copy"));
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s = CudaStatus(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
                                  "cudaIpcGetMemHandle");
      !s.ok()) {
    return s;
  }
  ExportedAllocation out;
  out.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  out.offset = static_cast<int64_t>(ptr - base);
  out.allocation_bytes = static_cast<int64_t>(size);
  out.device = attributes.device;
  absl::StatusOr<std::string> uuid = DeviceUuid(attributes.device);
  if (!uuid.ok()) return uuid.status();
  out.device_uuid = *std::move(uuid);
  return out;
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  cudaDeviceProp properties;
  if (absl::Status s =
          CudaStatus(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("device ", device, ": ", s.message()));
  }
  static_assert(sizeof(properties.uuid.bytes) == kDeviceUuidBytes);
  return std::string(properties.uuid.bytes, sizeof(properties.uuid.bytes));
}

OpenedDeviceAllocation::~OpenedDeviceAllocation() {
  if (base_ != nullptr) (void)CloseIpcHandle(base_);
}

absl::StatusOr<std::shared_ptr<const OpenedDeviceAllocation>> OpenDeviceAllocation(
    const std::string& handle, int device) {
  absl::StatusOr<void*> base = OpenIpcHandle(handle, device);
  if (!base.ok()) return base.status();
  return std::make_shared<const OpenedDeviceAllocation>(*base, device);
}

absl::Status CheckDeviceUsable(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " does not exist (this host has ", *count, ")"));
  }
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaFree(nullptr), absl::StrCat("creating a CUDA context on GPU ", device));
}

}  // namespace ckpt
