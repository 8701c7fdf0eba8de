#include "exchange/staging_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

StagingArena::~StagingArena() { Release(); }

void StagingArena::Release() {
  if (mapping_ != nullptr) munmap(mapping_, mapped_);
  mapping_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
  mapped_ = 0;
}

absl::StatusOr<char*> StagingArena::Reserve(size_t bytes) {
  if (bytes <= capacity_) return data_;
  Release();
  if (bytes == 0) return data_;
  const bool huge = huge_pages_ && bytes >= kHugePage;
  const size_t capacity = RoundUp(bytes, huge ? kHugePage : kPage);
  // Over-map by one huge page so the block can start on a 2 MiB boundary.
  const size_t mapped = huge ? capacity + kHugePage : capacity;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("exchange staging: mapping ", mapped,
                                                     " bytes failed: ", std::strerror(errno)));
  }
  mapping_ = p;
  mapped_ = mapped;
  char* data = static_cast<char*>(p);
  if (huge) {
    data = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(p), kHugePage));
    // Only a hint: without transparent huge pages the block stays in 4 KiB pages.
    madvise(data, capacity, MADV_HUGEPAGE);
  }
  data_ = data;
  capacity_ = capacity;
  ++mappings_;
  return data_;
}

StagingArenaPool::Lease::~Lease() {
  if (arena_ != nullptr) pool_->Return(std::move(arena_), std::move(purpose_));
}

StagingArenaPool::Lease StagingArenaPool::Acquire(const std::string& purpose) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.leases;
  if (idle_.empty()) {
    ++stats_.arenas;
    return Lease(this, std::make_unique<StagingArena>(huge_pages_), purpose);
  }
  auto better = [&purpose](const Idle& a, const Idle& b) {
    const bool a_same = a.purpose == purpose, b_same = b.purpose == purpose;
    if (a_same != b_same) return a_same;
    return a.arena->capacity() > b.arena->capacity();
  };
  auto best = idle_.begin();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (better(*it, *best)) best = it;
  }
  std::unique_ptr<StagingArena> arena = std::move(best->arena);
  idle_.erase(best);
  retired_mappings_ -= arena->mappings();  // counted again when it comes back
  return Lease(this, std::move(arena), purpose);
}

void StagingArenaPool::Return(std::unique_ptr<StagingArena> arena, std::string purpose) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t idle = 0;
  for (const Idle& a : idle_) idle += static_cast<int64_t>(a.arena->capacity());
  if (idle + static_cast<int64_t>(arena->capacity()) > max_idle_bytes_ && arena->capacity() > 0) {
    arena->Release();
    ++stats_.releases;
  }
  retired_mappings_ += arena->mappings();
  idle_.push_back(Idle{std::move(purpose), std::move(arena)});
}

StagingPoolStats StagingArenaPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StagingPoolStats out = stats_;
  out.mappings = retired_mappings_;
  out.idle_bytes = 0;
  for (const Idle& a : idle_) out.idle_bytes += static_cast<int64_t>(a.arena->capacity());
  return out;
}

std::string ShardBufferPool::Take(size_t bytes) {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.lower_bound(bytes);
    if (it != idle_.end()) {
      out = std::move(it->second);
      stats_.idle_bytes -= static_cast<int64_t>(it->first);
      idle_.erase(it);
      ++stats_.reused;
    } else {
      ++stats_.allocated;
    }
  }
  out.resize(bytes);  // within its capacity when reused: writes touched pages only
  return out;
}

void ShardBufferPool::Give(std::string buffer) {
  const size_t capacity = buffer.capacity();
  buffer.clear();
  if (capacity <= std::string().capacity()) return;  // held inline: no memory to keep
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.idle_bytes + static_cast<int64_t>(capacity) > max_idle_bytes_) {
    ++stats_.dropped;
    return;  // `buffer` is freed once the lock is released
  }
  stats_.idle_bytes += static_cast<int64_t>(capacity);
  idle_.emplace(capacity, std::move(buffer));
}

ShardBufferPoolStats ShardBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ckpt
