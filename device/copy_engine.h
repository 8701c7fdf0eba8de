// The copy engine the worker's staging pipeline moves device bytes with: page-locked host
// buffers and asynchronous device<->host copies, each direction in FIFO order (a CUDA stream).
// Production uses CudaCopyEngine (device/cuda_copy_engine.h); CI tests the pipeline with
// HostMemcpyCopyEngineForTests (testonly, never linked into a daemon).
#ifndef CKPT_DEVICE_COPY_ENGINE_H_
#define CKPT_DEVICE_COPY_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt {

// Page-locked host memory allocated by a CopyEngine; released through `release` when destroyed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::byte* data, size_t size, std::function<void(std::byte*)> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    release_ = std::move(other.release_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
  }
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::function<void(std::byte*)> release_;
};

enum class CopyDirection { kDeviceToHost, kHostToDevice };

// See the file comment. Thread-safe.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  // What the engine is ("cuda device 0", "host memcpy (tests)"), for messages.
  virtual absl::string_view name() const = 0;

  // Allocates `bytes` of page-locked host memory (ResourceExhausted when it cannot).
  virtual absl::StatusOr<PinnedBuffer> AllocatePinned(size_t bytes) = 0;

  // Enqueues an asynchronous copy of `bytes` from `src` to `dst` in `direction` (for
  // kDeviceToHost `src` is device memory, `dst` pinned host memory; the reverse for
  // kHostToDevice). Copies of one direction complete in the order they were enqueued. Returns a
  // ticket for Wait.
  virtual absl::StatusOr<uint64_t> Enqueue(CopyDirection direction, void* dst, const void* src,
                                           size_t bytes) = 0;

  // Blocks until the copy `ticket` completed (so every earlier copy of its direction too) and
  // returns its outcome; DeadlineExceeded when it has not completed by `deadline` (the copy
  // stays in flight: wait again before reusing its buffers). Each ticket is waited for once.
  virtual absl::Status Wait(uint64_t ticket, absl::Time deadline) = 0;
};

}  // namespace ckpt

#endif  // CKPT_DEVICE_COPY_ENGINE_H_
