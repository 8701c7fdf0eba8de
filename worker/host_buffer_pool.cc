#include "worker/host_buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kHugePageBytes = int64_t{2} << 20;
constexpr int64_t kPageBytes = 4096;

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

}  // namespace

HostBufferPool::HostBufferPool(int64_t max_bytes, int64_t chunk_bytes)
    : chunk_bytes_(RoundUp(std::max<int64_t>(chunk_bytes, kAlignment), kAlignment)),
      max_chunks_(std::max<int64_t>(1, max_bytes / chunk_bytes_)) {
  stats_.chunk_bytes = chunk_bytes_;
  stats_.max_chunks = max_chunks_;
}

HostBufferPool::~HostBufferPool() {
  for (char* c : chunks_) ::munmap(c, static_cast<size_t>(chunk_bytes_));
}

HostBufferPool::Chunk& HostBufferPool::Chunk::operator=(Chunk&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = std::exchange(other.index_, -1);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

void HostBufferPool::Chunk::Reset() {
  if (pool_ != nullptr) pool_->Return(index_);
  pool_ = nullptr;
  index_ = -1;
  data_ = nullptr;
}

absl::StatusOr<int> HostBufferPool::MapChunk() {
  // Over-map by a huge page and trim, so that the chunk starts on a huge-page boundary and the
  // kernel can back it with huge pages.
  const size_t span = static_cast<size_t>(chunk_bytes_ + kHugePageBytes);
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrCat("the worker's host pool could not map chunk ",
                                                     chunks_.size() + 1, " of ", chunk_bytes_,
                                                     " bytes: ", std::strerror(err)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  char* chunk = reinterpret_cast<char*>(aligned);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = aligned + static_cast<uintptr_t>(chunk_bytes_);
  if (start + span > end) ::munmap(reinterpret_cast<void*>(end), start + span - end);
  stats_.huge_pages = ::madvise(chunk, static_cast<size_t>(chunk_bytes_), MADV_HUGEPAGE) == 0;
  // Touch every page now, once: later copies into the chunk fault in nothing.
  for (int64_t at = 0; at < chunk_bytes_; at += kPageBytes) chunk[at] = 0;
  chunks_.push_back(chunk);
  ++stats_.chunks_mapped;
  stats_.bytes_mapped += chunk_bytes_;
  return static_cast<int>(chunks_.size()) - 1;
}

absl::StatusOr<HostBufferPool::Chunk> HostBufferPool::Acquire(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.acquires;
  if (free_.empty() && static_cast<int64_t>(chunks_.size()) >= max_chunks_) {
    ++stats_.waits;
    const bool got =
        returned_.wait_until(lock, absl::ToChronoTime(deadline), [this] { return !free_.empty(); });
    if (!got) {
      return absl::DeadlineExceededError(
          absl::StrCat("every chunk of the worker's host pool (", max_chunks_, " of ", chunk_bytes_,
                       " bytes) stayed in use until the deadline (other saves are writing)"));
    }
  }
  int index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
    ++stats_.reuses;
  } else {
    absl::StatusOr<int> mapped = MapChunk();
    if (!mapped.ok()) return mapped.status();
    index = *mapped;
  }
  ++stats_.chunks_in_use;
  return Chunk(this, index, chunks_[index]);
}

absl::Status HostBufferPool::Prefault() {
  std::lock_guard<std::mutex> lock(mu_);
  while (static_cast<int64_t>(chunks_.size()) < max_chunks_) {
    absl::StatusOr<int> mapped = MapChunk();
    if (!mapped.ok()) return mapped.status();
    free_.push_back(*mapped);
  }
  returned_.notify_all();
  return absl::OkStatus();
}

void HostBufferPool::Return(int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(index);
    --stats_.chunks_in_use;
  }
  returned_.notify_one();
}

HostPoolStats HostBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ckpt::worker
