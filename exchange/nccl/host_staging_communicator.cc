#include "exchange/nccl/host_staging_communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/cuda_status.h"

namespace ckpt {
namespace {

// A device allocation that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  // Allocates `bytes` (nothing for 0) and, when `host` is non-null, copies them in.
  absl::Status Init(size_t bytes, const void* host, absl::string_view op) {
    bytes_ = bytes;
    if (bytes == 0) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr_, bytes),
                                    absl::StrCat(op, ": staging ", bytes, " bytes on the device")));
    if (host != nullptr) {
      CKPT_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice),
                                      absl::StrCat(op, ": host-to-device copy")));
    }
    return absl::OkStatus();
  }

  absl::Status CopyOut(void* host, size_t bytes, absl::string_view op) const {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost),
                      absl::StrCat(op, ": device-to-host copy"));
  }

  char* get() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bytes a list of slices reaches into its buffer.
size_t Extent(absl::Span<const std::vector<ByteSlice>> slices) {
  size_t extent = 0;
  for (const auto& list : slices) {
    for (const ByteSlice& s : list) {
      if (s.length > 0) extent = std::max(extent, s.offset + s.length);
    }
  }
  return extent;
}

}  // namespace

HostStagingCommunicator::HostStagingCommunicator(std::unique_ptr<Communicator> device)
    : device_(std::move(device)), name_(absl::StrCat("host-staged ", device_->backend_name())) {}

absl::Status HostStagingCommunicator::Broadcast(void* data, size_t bytes, int root,
                                                absl::Time deadline) {
  constexpr absl::string_view kOp = "staged broadcast";
  DeviceBuffer d;
  CKPT_RETURN_IF_ERROR(d.Init(bytes, rank() == root ? data : nullptr, kOp));
  CKPT_RETURN_IF_ERROR(device_->Broadcast(d.get(), bytes, root, deadline));
  return d.CopyOut(data, bytes, kOp);
}

absl::Status HostStagingCommunicator::AllGatherV(const void* send, absl::Span<const size_t> counts,
                                                 void* recv, absl::Time deadline) {
  constexpr absl::string_view kOp = "staged all_gather_v";
  CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size()));
  DeviceBuffer s, r;
  CKPT_RETURN_IF_ERROR(s.Init(counts[rank()], send, kOp));
  CKPT_RETURN_IF_ERROR(r.Init(TotalBytes(counts), nullptr, kOp));
  CKPT_RETURN_IF_ERROR(device_->AllGatherV(s.get(), counts, r.get(), deadline));
  return r.CopyOut(recv, TotalBytes(counts), kOp);
}

absl::Status HostStagingCommunicator::GatherV(const void* send, size_t send_bytes,
                                              absl::Span<const size_t> counts, void* recv, int root,
                                              absl::Time deadline) {
  constexpr absl::string_view kOp = "staged gather_v";
  const size_t total = rank() == root ? TotalBytes(counts) : 0;
  DeviceBuffer s, r;
  CKPT_RETURN_IF_ERROR(s.Init(send_bytes, send, kOp));
  CKPT_RETURN_IF_ERROR(r.Init(total, nullptr, kOp));
  CKPT_RETURN_IF_ERROR(device_->GatherV(s.get(), send_bytes, counts, r.get(), root, deadline));
  return r.CopyOut(recv, total, kOp);
}

absl::Status HostStagingCommunicator::ScatterV(const void* send, absl::Span<const size_t> counts,
                                               void* recv, size_t recv_bytes, int root,
                                               absl::Time deadline) {
  constexpr absl::string_view kOp = "staged scatter_v";
  const size_t total = rank() == root ? TotalBytes(counts) : 0;
  DeviceBuffer s, r;
  CKPT_RETURN_IF_ERROR(s.Init(total, send, kOp));
  CKPT_RETURN_IF_ERROR(r.Init(recv_bytes, nullptr, kOp));
  CKPT_RETURN_IF_ERROR(device_->ScatterV(s.get(), counts, r.get(), recv_bytes, root, deadline));
  return r.CopyOut(recv, recv_bytes, kOp);
}

absl::Status HostStagingCommunicator::AllToAllV(const void* send,
                                                absl::Span<const size_t> send_counts, void* recv,
                                                absl::Span<const size_t> recv_counts,
                                                absl::Time deadline) {
  constexpr absl::string_view kOp = "staged all_to_all_v";
  DeviceBuffer s, r;
  CKPT_RETURN_IF_ERROR(s.Init(TotalBytes(send_counts), send, kOp));
  CKPT_RETURN_IF_ERROR(r.Init(TotalBytes(recv_counts), nullptr, kOp));
  CKPT_RETURN_IF_ERROR(device_->AllToAllV(s.get(), send_counts, r.get(), recv_counts, deadline));
  return r.CopyOut(recv, TotalBytes(recv_counts), kOp);
}

absl::Status HostStagingCommunicator::IndexedAllToAllV(
    const void* send, absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
    absl::Span<const std::vector<ByteSlice>> recv_slices, absl::Time deadline) {
  constexpr absl::string_view kOp = "staged indexed_all_to_all_v";
  // Stage the whole reach of the slices; the receive side is copied in first so that bytes no
  // slice covers come back unchanged.
  const size_t send_extent = Extent(send_slices), recv_extent = Extent(recv_slices);
  DeviceBuffer s, r;
  CKPT_RETURN_IF_ERROR(s.Init(send_extent, send, kOp));
  CKPT_RETURN_IF_ERROR(r.Init(recv_extent, recv, kOp));
  CKPT_RETURN_IF_ERROR(
      device_->IndexedAllToAllV(s.get(), send_slices, r.get(), recv_slices, deadline));
  return r.CopyOut(recv, recv_extent, kOp);
}

absl::Status HostStagingCommunicator::Send(const void* data, size_t bytes, int peer, uint32_t tag,
                                           absl::Time deadline) {
  DeviceBuffer d;
  CKPT_RETURN_IF_ERROR(d.Init(bytes, data, "staged send"));
  return device_->Send(d.get(), bytes, peer, tag, deadline);
}

absl::Status HostStagingCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                           absl::Time deadline) {
  DeviceBuffer d;
  CKPT_RETURN_IF_ERROR(d.Init(bytes, nullptr, "staged recv"));
  CKPT_RETURN_IF_ERROR(device_->Recv(d.get(), bytes, peer, tag, deadline));
  return d.CopyOut(data, bytes, "staged recv");
}

absl::Status HostStagingCommunicator::Barrier(absl::Time deadline) {
  return device_->Barrier(deadline);
}

}  // namespace ckpt
