#include "exchange/staging_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

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
  return data_;
}

}  // namespace ckpt
