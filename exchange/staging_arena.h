// Reusable host memory for the send/receive staging of exchange algorithms.
#ifndef CKPT_EXCHANGE_STAGING_ARENA_H_
#define CKPT_EXCHANGE_STAGING_ARENA_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace ckpt {

// One block of uninitialized host memory that grows on demand and is kept between uses, so
// that an exchange does not zero-fill and page-fault fresh staging memory on every call. An
// exchange uses the arena passed in ExchangeOptions::staging (keeping its pages mapped across
// calls) or, without one, a temporary arena of its own. Blocks of 2 MiB and more are mapped
// 2 MiB-aligned and, unless disabled, marked MADV_HUGEPAGE (the kernel may ignore the hint).
// Not thread-safe: one exchange at a time.
class StagingArena {
 public:
  explicit StagingArena(bool huge_pages = true) : huge_pages_(huge_pages) {}
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  // At least `bytes` bytes, contents unspecified, valid until the next Reserve() that grows
  // the block, Release() or destruction. Growing discards the old contents.
  // ResourceExhausted when the memory cannot be mapped.
  absl::StatusOr<char*> Reserve(size_t bytes);

  // Unmaps the block.
  void Release();

  size_t capacity() const { return capacity_; }
  bool huge_pages() const { return huge_pages_; }

 private:
  bool huge_pages_;
  char* data_ = nullptr;
  size_t capacity_ = 0;
  size_t mapped_ = 0;  // bytes of the mapping (may exceed capacity_ for alignment)
  void* mapping_ = nullptr;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_STAGING_ARENA_H_
