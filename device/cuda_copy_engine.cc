#include "device/cuda_copy_engine.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/cuda_status.h"
#include "device/gpu.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(int device) {
  if (absl::StatusOr<int> count = CudaDeviceCount(); !count.ok()) return count.status();
  if (absl::Status s =
          CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
      !s.ok()) {
    return s;
  }
  cudaStream_t d2h = nullptr;
  cudaStream_t h2d = nullptr;
  if (absl::Status s =
          CudaStatus(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok()) {
    cudaStreamDestroy(d2h);
    return s;
  }
  return std::unique_ptr<CudaCopyEngine>(new CudaCopyEngine(device, d2h, h2d));
}

CudaCopyEngine::CudaCopyEngine(int device, void* d2h, void* h2d)
    : device_(device), name_(absl::StrCat("cuda device ", device)), streams_{d2h, h2d} {}

CudaCopyEngine::~CudaCopyEngine() {
  cudaSetDevice(device_);
  for (void* s : streams_) cudaStreamSynchronize(static_cast<cudaStream_t>(s));
  for (auto& [ticket, event] : events_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  for (void* s : streams_) cudaStreamDestroy(static_cast<cudaStream_t>(s));
}

absl::StatusOr<PinnedBuffer> CudaCopyEngine::AllocatePinned(size_t bytes) {
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  void* data = nullptr;
  absl::Status s = CudaStatus(cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocDefault),
                              absl::StrCat("cudaHostAlloc of ", bytes, " pinned bytes"));
  if (!s.ok()) return s;
  return PinnedBuffer(static_cast<std::byte*>(data), bytes, [](std::byte* p) { cudaFreeHost(p); });
}

absl::StatusOr<uint64_t> CudaCopyEngine::Enqueue(CopyDirection direction, void* dst,
                                                 const void* src, size_t bytes) {
  const bool to_host = direction == CopyDirection::kDeviceToHost;
  cudaStream_t stream = static_cast<cudaStream_t>(streams_[to_host ? 0 : 1]);
  // The calling thread may not have the worker's device current.
  if (absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  absl::Status s =
      CudaStatus(cudaMemcpyAsync(dst, src, bytes,
                                 to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream),
                 to_host ? "cudaMemcpyAsync (device to host)" : "cudaMemcpyAsync (host to device)");
  if (!s.ok()) return s;
  cudaEvent_t event = nullptr;
  s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  if (!s.ok()) return s;
  s = CudaStatus(cudaEventRecord(event, stream), "cudaEventRecord");
  if (!s.ok()) {
    cudaEventDestroy(event);
    return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  events_[ticket] = event;
  return ticket;
}

absl::Status CudaCopyEngine::Wait(uint64_t ticket, absl::Time deadline) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(ticket);
    if (it == events_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("copy ticket ", ticket, " is not in flight"));
    }
    event = static_cast<cudaEvent_t>(it->second);
  }
  // Polled (not cudaEventSynchronize) so that a copy that never completes meets the deadline.
  absl::Duration nap = absl::Microseconds(20);
  while (true) {
    cudaError_t e = cudaEventQuery(event);
    if (e != cudaErrorNotReady) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.erase(ticket);
      cudaEventDestroy(event);
      return CudaStatus(e, absl::StrCat("copy on ", name_));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("copy on ", name_, " did not complete by its deadline"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

}  // namespace ckpt
