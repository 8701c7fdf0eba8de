// The worker's host memory for save snapshots: fixed-size chunks, aligned to 4096 bytes (fit for
// O_DIRECT), mapped with mmap and touched once (MADV_HUGEPAGE asked for, where the kernel gives
// it), then reused by every operation of every job and never unmapped until the pool is
// destroyed. A memcpy into memory mapped afresh runs at a fraction of the speed of one into
// touched memory (each page faults in on first write), so a save that copies into the pool
// faults in nothing once the pool has grown to its working size.
//
// The pool grows lazily, a chunk at a time, up to its bound (`max_bytes`); Prefault() maps and
// touches it whole up front. When every chunk is in use, Acquire waits (until its deadline) for
// one to be returned: back-pressure, never growth past the bound.
//
// Thread-safe. No gRPC, no logging.
#ifndef CKPT_WORKER_HOST_BUFFER_POOL_H_
#define CKPT_WORKER_HOST_BUFFER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::worker {

// What the pool holds and did (for logs and tests).
struct HostPoolStats {
  int64_t chunk_bytes = 0;
  int64_t max_chunks = 0;
  int64_t chunks_mapped = 0;  // mapped and touched so far (never unmapped)
  int64_t bytes_mapped = 0;
  int64_t chunks_in_use = 0;
  int64_t acquires = 0;
  int64_t reuses = 0;       // acquires served by a chunk mapped before: no page faulted in
  int64_t waits = 0;        // acquires that waited for a chunk to be returned (the pool was full)
  bool huge_pages = false;  // MADV_HUGEPAGE was accepted for the chunks mapped
};

// See the file comment.
class HostBufferPool {
 public:
  static constexpr int64_t kDefaultChunkBytes = int64_t{8} << 20;
  static constexpr int64_t kAlignment = 4096;

  // Up to `max_bytes` in chunks of `chunk_bytes` (rounded up to a multiple of 4096); at least
  // one chunk. Nothing is mapped yet.
  explicit HostBufferPool(int64_t max_bytes, int64_t chunk_bytes = kDefaultChunkBytes);
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;
  ~HostBufferPool();  // every chunk must have been returned

  // A chunk in use; returned to the pool when destroyed (or Reset).
  class Chunk {
   public:
    Chunk() = default;
    Chunk(Chunk&& other) noexcept { *this = std::move(other); }
    Chunk& operator=(Chunk&& other) noexcept;
    ~Chunk() { Reset(); }
    char* data() const { return data_; }
    int64_t size() const { return pool_ == nullptr ? 0 : pool_->chunk_bytes_; }
    explicit operator bool() const { return pool_ != nullptr; }
    void Reset();

   private:
    friend class HostBufferPool;
    Chunk(HostBufferPool* pool, int index, char* data) : pool_(pool), index_(index), data_(data) {}
    HostBufferPool* pool_ = nullptr;
    int index_ = -1;
    char* data_ = nullptr;
  };

  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t max_chunks() const { return max_chunks_; }

  // A free chunk: one returned earlier, else a newly mapped one while under the bound, else
  // waits until one is returned. DeadlineExceeded when none came by `deadline`;
  // ResourceExhausted when mapping fails (naming the bytes and the errno).
  absl::StatusOr<Chunk> Acquire(absl::Time deadline);

  // Maps and touches every chunk up to the bound, so that even the first save is warm.
  absl::Status Prefault();

  HostPoolStats stats() const;

 private:
  // Maps and touches one more chunk (mu_ held); its index.
  absl::StatusOr<int> MapChunk();
  void Return(int index);

  const int64_t chunk_bytes_;
  const int64_t max_chunks_;
  mutable std::mutex mu_;
  std::condition_variable returned_;
  std::vector<char*> chunks_;  // mapped, by index
  std::vector<int> free_;      // indices of chunks not in use
  HostPoolStats stats_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_HOST_BUFFER_POOL_H_
