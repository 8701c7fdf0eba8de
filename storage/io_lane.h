// Internals shared by the I/O engine's write and read paths: the bounded staging-buffer pool,
// per-thread lanes (a queue, op slots, staging buffers) and the thread fan-out. Not a public API.
#ifndef CKPT_STORAGE_IO_LANE_H_
#define CKPT_STORAGE_IO_LANE_H_

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "storage/io_engine.h"
#include "storage/io_queue.h"

namespace ckpt::io_internal {

inline constexpr int64_t kAlign = 4096;
inline constexpr int64_t kHashSlice = int64_t{256} << 10;  // copy+hash granularity (stays in L2)

// open(2). Defined weak in io_lane.cc: a test that links the testonly //storage:
// direct_io_refusal gets its definition instead, which can refuse O_DIRECT
// (storage/direct_io_refusal.h); the release engine calls open(2) with no test on its path.
int OpenFile(const char* path, int flags, mode_t mode = 0);

inline int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
inline int64_t RoundDown(int64_t v, int64_t a) { return v / a * a; }

// Hands out at most `capacity` aligned buffers of `bytes` each; allocated lazily, reused.
class BufferPool {
 public:
  BufferPool(int64_t bytes, int capacity) : bytes_(bytes), capacity_(capacity) {}
  ~BufferPool() {
    for (char* b : free_) std::free(b);
  }
  char* Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || allocated_ < capacity_; });
    if (!free_.empty()) {
      char* b = free_.back();
      free_.pop_back();
      return b;
    }
    ++allocated_;
    return static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(bytes_)));
  }
  void Release(char* b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
    }
    cv_.notify_one();
  }

 private:
  const int64_t bytes_;
  const int capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
  int allocated_ = 0;
};

// Per-thread transfer state: a queue, op slots, and up to `depth` staging buffers.
class Lane {
 public:
  Lane(std::unique_ptr<IoQueue> queue, int depth, BufferPool* pool)
      : queue_(std::move(queue)), slots_(depth), pool_(pool), depth_(depth) {
    for (int i = 0; i < depth; ++i) free_slots_.push_back(i);
  }
  ~Lane() {
    Drain();
    for (char* b : local_) pool_->Release(b);
  }

  IoQueue& queue() { return *queue_; }
  bool HasFreeSlot() const { return !free_slots_.empty(); }

  IoOp* TakeSlot() {
    int i = free_slots_.back();
    free_slots_.pop_back();
    slots_[i] = IoOp{};
    slots_[i].user = reinterpret_cast<void*>(static_cast<intptr_t>(i));
    return &slots_[i];
  }
  void FreeSlot(IoOp* op) { free_slots_.push_back(static_cast<int>(op - slots_.data())); }

  // A staging buffer if one is free locally or the per-lane limit allows taking one.
  char* TryBuffer() {
    if (!local_.empty()) {
      char* b = local_.back();
      local_.pop_back();
      return b;
    }
    if (held_ < depth_) {
      ++held_;
      return pool_->Acquire();
    }
    return nullptr;
  }
  void ReturnBuffer(char* b) {
    if (b != nullptr) local_.push_back(b);
  }

  // Waits for every in-flight op, discarding results (used on error paths).
  void Drain() {
    while (queue_->inflight() > 0) {
      if (!queue_->WaitAny().ok()) break;
    }
  }

 private:
  std::unique_ptr<IoQueue> queue_;
  std::vector<IoOp> slots_;
  std::vector<int> free_slots_;
  BufferPool* pool_;
  std::vector<char*> local_;
  int held_ = 0;
  int depth_;
};

// Shared by the threads of one WriteFiles / ReadRanges call.
struct Run {
  const IoOptions& options;
  BufferPool pool;
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  IoStats stats;

  explicit Run(const IoOptions& o)
      : options(o), pool(o.buffer_bytes, std::max(1, o.num_threads) * std::max(1, o.queue_depth)) {}

  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
    failed = true;
  }
  void AddStats(const IoStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    stats.uring_files += s.uring_files;
    stats.posix_files += s.posix_files;
    stats.direct_files += s.direct_files;
    stats.direct_fallbacks += s.direct_fallbacks;
    stats.bytes += s.bytes;
  }
};

absl::Status ValidateOptions(const IoOptions& o);
absl::StatusOr<std::unique_ptr<IoQueue>> MakeQueue(const IoOptions& o);
// True for the status that means "O_DIRECT refused by the filesystem, retry buffered".
bool IsDirectRefused(const absl::Status& s);

// Runs `work(lane, index)` for indices [0, n) on up to num_threads threads, stopping early
// after the first failure.
template <typename Work>
absl::Status ParallelFor(Run& run, size_t n, const std::vector<size_t>& order, Work work) {
  std::atomic<size_t> next{0};
  auto body = [&] {
    auto queue = MakeQueue(run.options);
    if (!queue.ok()) {
      run.Fail(queue.status());
      return;
    }
    Lane lane(std::move(*queue), run.options.queue_depth, &run.pool);
    while (!run.failed) {
      size_t i = next.fetch_add(1);
      if (i >= n) break;
      absl::Status s = work(lane, order[i]);
      if (!s.ok()) {
        lane.Drain();
        run.Fail(std::move(s));
      }
    }
  };
  const size_t threads = std::min<size_t>(n, static_cast<size_t>(run.options.num_threads));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(body);
  if (threads > 0) body();
  for (auto& t : pool) t.join();
  if (run.options.stats != nullptr) *run.options.stats = run.stats;
  return run.first_error;
}

}  // namespace ckpt::io_internal

#endif  // CKPT_STORAGE_IO_LANE_H_
