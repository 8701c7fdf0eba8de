#include "device/host_memcpy_copy_engine_for_tests.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace ckpt {

HostMemcpyCopyEngineForTests::HostMemcpyCopyEngineForTests() {
  for (Lane& lane : lanes_) lane.thread = std::thread([this, &lane] { Serve(&lane); });
}

HostMemcpyCopyEngineForTests::~HostMemcpyCopyEngineForTests() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (Lane& lane : lanes_) lane.thread.join();
}

void HostMemcpyCopyEngineForTests::Serve(Lane* lane) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !lane->queue.empty(); });
    if (lane->queue.empty()) return;  // stopping, nothing left
    HostCopy copy = lane->queue.front();
    lock.unlock();
    absl::Status s = hook_ ? hook_(copy) : absl::OkStatus();
    if (s.ok() && copy.bytes > 0) std::memcpy(copy.dst, copy.src, copy.bytes);
    lock.lock();
    lane->queue.pop_front();
    done_[copy.ticket] = std::move(s);
    cv_.notify_all();
  }
}

absl::StatusOr<PinnedBuffer> HostMemcpyCopyEngineForTests::AllocatePinned(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_next_allocation_) {
    fail_next_allocation_ = false;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot pin ", bytes, " bytes of host memory (injected by the test)"));
  }
  auto* data = static_cast<std::byte*>(::operator new(bytes == 0 ? 1 : bytes));
  ++allocations_;
  live_bytes_ += static_cast<int64_t>(bytes);
  return PinnedBuffer(data, bytes, [this, bytes](std::byte* p) {
    ::operator delete(p);
    std::lock_guard<std::mutex> lock(mu_);
    live_bytes_ -= static_cast<int64_t>(bytes);
  });
}

absl::StatusOr<uint64_t> HostMemcpyCopyEngineForTests::Enqueue(CopyDirection direction, void* dst,
                                                               const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  lanes_[direction == CopyDirection::kDeviceToHost ? 0 : 1].queue.push_back(
      HostCopy{ticket, direction, dst, src, bytes});
  cv_.notify_all();
  return ticket;
}

absl::Status HostMemcpyCopyEngineForTests::Wait(uint64_t ticket, absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (done_.count(ticket) == 0) {
    if (ticket == 0 || ticket >= next_ticket_) {
      return absl::InvalidArgumentError(absl::StrCat("copy ticket ", ticket, " was never issued"));
    }
    if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
        done_.count(ticket) == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("copy ", ticket, " did not complete by its deadline"));
    }
  }
  absl::Status s = std::move(done_[ticket]);
  done_.erase(ticket);
  return s;
}

int64_t HostMemcpyCopyEngineForTests::pinned_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

int64_t HostMemcpyCopyEngineForTests::pinned_bytes_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

void HostMemcpyCopyEngineForTests::FailNextAllocation() {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_allocation_ = true;
}

}  // namespace ckpt
