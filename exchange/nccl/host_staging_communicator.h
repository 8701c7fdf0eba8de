// Presents a device-memory communicator (NCCL) as a host-memory one: every call copies its
// host inputs to device buffers, runs the collective on the device, and copies the results
// back. This lets the exchange algorithms (which move host buffers) run over NCCL, e.g. to check
// them on a GPU machine; it costs two PCIe copies per call and a device allocation per call.
#ifndef CKPT_EXCHANGE_NCCL_HOST_STAGING_COMMUNICATOR_H_
#define CKPT_EXCHANGE_NCCL_HOST_STAGING_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "exchange/communicator.h"

namespace ckpt {

// Wraps `device` (memory_kind() == kDevice; its CUDA device must be current on the calling
// thread). CUDA failures are returned as Status (see device/cuda_status.h).
class HostStagingCommunicator : public Communicator {
 public:
  explicit HostStagingCommunicator(std::unique_ptr<Communicator> device);

  int rank() const override { return device_->rank(); }
  int size() const override { return device_->size(); }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  absl::string_view backend_name() const override { return name_; }

  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Time deadline) override;
  absl::Status AllGatherV(const void* send, absl::Span<const size_t> counts, void* recv,
                          absl::Time deadline) override;
  absl::Status GatherV(const void* send, size_t send_bytes, absl::Span<const size_t> counts,
                       void* recv, int root, absl::Time deadline) override;
  absl::Status ScatterV(const void* send, absl::Span<const size_t> counts, void* recv,
                        size_t recv_bytes, int root, absl::Time deadline) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Time deadline) override;
  absl::Status IndexedAllToAllV(const void* send,
                                absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
                                absl::Span<const std::vector<ByteSlice>> recv_slices,
                                absl::Time deadline) override;
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Time deadline) override;
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag, absl::Time deadline) override;
  absl::Status Barrier(absl::Time deadline) override;

 private:
  std::unique_ptr<Communicator> device_;
  std::string name_;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_NCCL_HOST_STAGING_COMMUNICATOR_H_
