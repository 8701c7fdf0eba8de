// The production CopyEngine: cudaHostAlloc'd pinned buffers and cudaMemcpyAsync on two
// non-blocking streams of the worker's own (one per direction) on the worker's GPU, with one
// event per copy. Waiting polls the event up to the deadline, so a hung copy becomes
// DeadlineExceeded instead of a hang. CUDA errors convert in device/cuda_status only.
//
// Not yet run on a GPU (this machine has none): built and linked only.
#ifndef CKPT_DEVICE_CUDA_COPY_ENGINE_H_
#define CKPT_DEVICE_CUDA_COPY_ENGINE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "device/copy_engine.h"

namespace ckpt {

// See the file comment. Thread-safe.
class CudaCopyEngine final : public CopyEngine {
 public:
  // Creates the streams on `device`; FailedPrecondition "no CUDA device: ..." without a GPU.
  static absl::StatusOr<std::unique_ptr<CudaCopyEngine>> Create(int device);
  ~CudaCopyEngine() override;

  absl::string_view name() const override { return name_; }
  absl::StatusOr<PinnedBuffer> AllocatePinned(size_t bytes) override;
  absl::StatusOr<uint64_t> Enqueue(CopyDirection direction, void* dst, const void* src,
                                   size_t bytes) override;
  absl::Status Wait(uint64_t ticket, absl::Time deadline) override;

 private:
  CudaCopyEngine(int device, void* d2h, void* h2d);

  const int device_;
  const std::string name_;
  void* streams_[2];  // cudaStream_t: device->host, host->device
  std::mutex mu_;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, void*> events_;  // cudaEvent_t per copy not yet waited for
};

}  // namespace ckpt

#endif  // CKPT_DEVICE_CUDA_COPY_ENGINE_H_
