// A CopyEngine over plain host memory, for testing the staging pipeline without a GPU: the
// "device" pointers are ordinary host memory, "pinned" buffers ordinary heap memory, and each
// direction's copies run in FIFO order on one thread of its own (like a CUDA stream), so the
// pipeline's overlap, ordering, budget and error paths are exercised for real. Tests observe
// and steer it through a hook run on the copy thread before each copy.
//
// Testonly (Bazel refuses it in any non-test target): a daemon never links it.
#ifndef CKPT_DEVICE_HOST_MEMCPY_COPY_ENGINE_FOR_TESTS_H_
#define CKPT_DEVICE_HOST_MEMCPY_COPY_ENGINE_FOR_TESTS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "device/copy_engine.h"

namespace ckpt {

// One copy as the hook sees it.
struct HostCopy {
  uint64_t ticket = 0;
  CopyDirection direction = CopyDirection::kDeviceToHost;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// See the file comment. Thread-safe.
class HostMemcpyCopyEngineForTests final : public CopyEngine {
 public:
  HostMemcpyCopyEngineForTests();
  ~HostMemcpyCopyEngineForTests() override;  // finishes queued copies first

  absl::string_view name() const override { return "host memcpy (tests)"; }
  absl::StatusOr<PinnedBuffer> AllocatePinned(size_t bytes) override;
  absl::StatusOr<uint64_t> Enqueue(CopyDirection direction, void* dst, const void* src,
                                   size_t bytes) override;
  absl::Status Wait(uint64_t ticket, absl::Time deadline) override;

  // Runs on the copy thread before each copy; a non-OK status fails that copy (not copied).
  // Set before the first Enqueue.
  void set_hook(std::function<absl::Status(const HostCopy&)> hook) { hook_ = std::move(hook); }
  // Pinned allocations made so far and the bytes they hold now.
  int64_t pinned_allocations() const;
  int64_t pinned_bytes_live() const;
  // Fails the next AllocatePinned with ResourceExhausted.
  void FailNextAllocation();

 private:
  struct Lane {
    std::deque<HostCopy> queue;
    std::thread thread;
  };
  void Serve(Lane* lane);

  std::function<absl::Status(const HostCopy&)> hook_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, absl::Status> done_;  // completed, not yet waited for
  int64_t allocations_ = 0;
  int64_t live_bytes_ = 0;
  bool fail_next_allocation_ = false;
  Lane lanes_[2];
};

}  // namespace ckpt

#endif  // CKPT_DEVICE_HOST_MEMCPY_COPY_ENGINE_FOR_TESTS_H_
