// The few CUDA needs of the worker, the client and the NCCL backend: how many GPUs this process
// sees, which one a local rank uses, and CUDA IPC handles for sharing device tensors between
// processes. With no GPU (or no driver) every call returns FailedPrecondition naming the CUDA
// error: a normal, reported condition. CUDA codes convert in device/cuda_status only.
#ifndef CKPT_DEVICE_GPU_H_
#define CKPT_DEVICE_GPU_H_

#include <cstdint>
#include <memory>
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

// The UUID of CUDA device `device` (cudaDeviceProp.uuid, kDeviceUuidBytes bytes; see
// device/device_uuid.h). FailedPrecondition without a GPU.
absl::StatusOr<std::string> DeviceUuid(int device);

// Opens another process's device allocation on `device`; close with CloseIpcHandle.
absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device);
absl::Status CloseIpcHandle(void* device_ptr);

// Copies `bytes` host bytes at `host` to `device_ptr` on `device` (synchronous: done on return).
// FailedPrecondition without a GPU; the CUDA error otherwise.
absl::Status CopyHostToDevice(void* device_ptr, int device, const void* host, size_t bytes);
// Copies `bytes` from `device_ptr` on `device` to `host` (synchronous), errors as above.
absl::Status CopyDeviceToHost(void* host, const void* device_ptr, int device, size_t bytes);

// Bytes of a cudaIpcMemHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// The CUDA allocation that contains a device pointer, exported for another process. PyTorch's
// caching allocator sub-allocates, so the handle is the allocation's (cuMemGetAddressRange)
// and the tensor sits `offset` bytes into it.
struct ExportedAllocation {
  std::string ipc_handle;  // cudaIpcMemHandle_t of the allocation's base
  int64_t offset = 0;      // device_ptr - base
  int64_t allocation_bytes = 0;
  int device = -1;          // CUDA ordinal in the exporting process
  std::string device_uuid;  // the device's UUID (DeviceUuid): how the worker matches its GPU
};

// Exports the allocation containing `device_ptr`. FailedPrecondition without a GPU; for memory
// that is not device memory (host, managed) InvalidArgument; for allocations CUDA IPC cannot
// export (virtual-memory and pool allocations: cuMemCreate, cudaMallocAsync, PyTorch's
// expandable_segments)
// FailedPrecondition saying so, with the allocation's base, size and device, and what to do.
absl::StatusOr<ExportedAllocation> ExportDeviceAllocation(const void* device_ptr);

// Another process's allocation opened in this one (cudaIpcOpenMemHandle); closed when the
// last reference goes. A process may open one handle once: keep and share the object.
class OpenedDeviceAllocation {
 public:
  OpenedDeviceAllocation(void* base, int device) : base_(base), device_(device) {}
  ~OpenedDeviceAllocation();
  OpenedDeviceAllocation(const OpenedDeviceAllocation&) = delete;
  OpenedDeviceAllocation& operator=(const OpenedDeviceAllocation&) = delete;
  void* base() const { return base_; }
  int device() const { return device_; }

 private:
  void* base_;
  int device_;
};

// Opens `handle` (kCudaIpcHandleBytes bytes) on `device`.
absl::StatusOr<std::shared_ptr<const OpenedDeviceAllocation>> OpenDeviceAllocation(
    const std::string& handle, int device);

// Whether this process can serve device memory on `device`: the device exists, can be made
// current and gets a context. The error says why not (for the worker's "no device" log line).
absl::Status CheckDeviceUsable(int device);

}  // namespace ckpt

#endif  // CKPT_DEVICE_GPU_H_
