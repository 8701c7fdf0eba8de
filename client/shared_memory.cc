#include "client/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::client {

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Create(const std::string& name,
                                                                     size_t size,
                                                                     absl::string_view what) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor ", what,
                                                     ": cannot create shared-memory segment ", name,
                                                     ": ", std::strerror(errno)));
  }
  void* addr = nullptr;
  if (size > 0) {
    // posix_fallocate reserves the pages now, so a full /dev/shm fails here, not as a SIGBUS.
    int err = ftruncate(fd, static_cast<off_t>(size)) == 0 ? posix_fallocate(fd, 0, size) : errno;
    if (err == 0) {
      // MAP_POPULATE maps every page now: the first save or load that touches the memory
      // does not take a page fault per 4 KiB (a 512 MiB staging buffer: 131,072 faults).
      addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (addr == MAP_FAILED) err = errno;
    }
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("tensor ", what, ": cannot allocate ", size,
                                                       " bytes of shared memory (", name,
                                                       "): ", std::strerror(err)));
    }
  }
  close(fd);
  return std::shared_ptr<SharedSegment>(
      new SharedSegment(name, static_cast<std::byte*>(addr), size));
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr && owns_mapping_) munmap(data_, size_);
  shm_unlink(name_.c_str());  // ENOENT when the worker already released it: fine
}

absl::StatusOr<SharedAllocator::Allocation> SharedAllocator::Allocate(size_t size,
                                                                      absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = segments_.begin(); it != segments_.end();) {
    it = it->second.expired() ? segments_.erase(it) : std::next(it);
  }
  const size_t aligned = (size + 63) / 64 * 64;
  if (size <= kSmallBytes) {
    std::shared_ptr<SharedSegment> arena = arena_.lock();
    if (arena == nullptr || arena_used_ + aligned > arena->size()) {
      absl::StatusOr<std::shared_ptr<SharedSegment>> fresh =
          SharedSegment::Create(absl::StrCat(prefix_, next_++), kArenaBytes, what);
      if (!fresh.ok()) return fresh.status();
      arena = *std::move(fresh);
      arena_ = arena;
      arena_used_ = 0;
      segments_[reinterpret_cast<uintptr_t>(arena->data())] = arena;
    }
    Allocation a{arena, static_cast<int64_t>(arena_used_), size};
    arena_used_ += aligned;
    return a;
  }
  absl::StatusOr<std::shared_ptr<SharedSegment>> own =
      SharedSegment::Create(absl::StrCat(prefix_, next_++), size, what);
  if (!own.ok()) return own.status();
  segments_[reinterpret_cast<uintptr_t>((*own)->data())] = *own;
  return Allocation{*std::move(own), 0, size};
}

absl::StatusOr<SharedAllocator::Allocation> SharedAllocator::Adopt(const std::string& existing,
                                                                   void* data, size_t size,
                                                                   absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::shared_ptr<SharedSegment>> linked =
      SharedSegment::Link(existing, absl::StrCat(prefix_, next_++), data, size, what);
  if (!linked.ok()) return linked.status();
  segments_[reinterpret_cast<uintptr_t>((*linked)->data())] = *linked;
  return Allocation{*std::move(linked), 0, size};
}

std::optional<SharedAllocator::Allocation> SharedAllocator::Find(const void* data,
                                                                 size_t size) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = segments_.upper_bound(begin);  // first segment starting after `data`
  if (it == segments_.begin()) return std::nullopt;
  --it;
  std::shared_ptr<SharedSegment> segment = it->second.lock();
  if (segment == nullptr || segment->data() == nullptr) return std::nullopt;
  const uintptr_t start = reinterpret_cast<uintptr_t>(segment->data());
  if (begin - start > segment->size() || size > segment->size() - (begin - start)) {
    return std::nullopt;
  }
  return Allocation{std::move(segment), static_cast<int64_t>(begin - start), size};
}

SharedAllocator& SharedAllocator::ForThisProcess() {
  // A forked child must not name segments after its parent: it gets its own allocator (the
  // parent's is left alone; its lock may have been held at the fork).
  static pid_t owner = 0;
  static SharedAllocator* allocator = nullptr;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const pid_t pid = getpid();
  if (allocator == nullptr || owner != pid) {
    allocator = new SharedAllocator(absl::StrCat("/ckpt.empty.p", pid, "."));
    owner = pid;
  }
  return *allocator;
}

}  // namespace ckpt::client
