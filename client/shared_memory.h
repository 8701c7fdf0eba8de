// POSIX shared-memory segments a trainer process creates for tensors its worker daemon maps,
// and an allocator that hands out tensor memory in them independently of any state dict (the
// Python package's ckpt.empty): a tensor allocated here and later added to a state dict with
// StateDict::AddHostView is read and written by the worker in place, without copies.
// No gRPC, threads or logging (the allocator takes a lock of its own).
#ifndef CKPT_CLIENT_SHARED_MEMORY_H_
#define CKPT_CLIENT_SHARED_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::client {

// One segment, mapped read-write in this process. Unmapped and unlinked when destroyed (the
// worker unlinks it too when the trainer says Goodbye or dies; ENOENT then is fine).
class SharedSegment {
 public:
  // Creates `name` (must not exist) of `size` bytes, zero-filled and reserved (posix_fallocate,
  // so a full /dev/shm fails here rather than as SIGBUS later). ResourceExhausted naming
  // `what` (the tensor) and the segment on failure.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Create(const std::string& name, size_t size,
                                                               absl::string_view what);
  // Gives memory another library already placed in the shared-memory file `existing` (a name
  // as for shm_open, e.g. PyTorch's share_memory_) and mapped in this process at [data, data +
  // size) the second name `name`, so that the worker maps the same pages. FailedPrecondition
  // naming `what` unless `existing` is a regular file of this user of exactly `size` bytes that
  // this process maps MAP_SHARED at `data` from offset 0. The segment never unmaps that
  // mapping (it stays the other library's); destroying it only unlinks `name`.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Link(const std::string& existing,
                                                             const std::string& name, void* data,
                                                             size_t size, absl::string_view what);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }  // nullptr for an empty segment
  size_t size() const { return size_; }

 private:
  SharedSegment(std::string name, std::byte* data, size_t size, bool owns_mapping = true)
      : name_(std::move(name)), data_(data), size_(size), owns_mapping_(owns_mapping) {}
  std::string name_;
  std::byte* data_;
  size_t size_;
  bool owns_mapping_;  // false for Link: the mapping belongs to another library
};

// Tensor memory in shared segments named "<prefix><n>": allocations up to kSmallBytes share
// arenas of kArenaBytes, larger ones get their own segment; 64-byte aligned. A segment lives
// as long as any Allocation (or state dict) holds it. Thread-safe.
class SharedAllocator {
 public:
  static constexpr size_t kArenaBytes = size_t{64} << 20;
  static constexpr size_t kSmallBytes = size_t{8} << 20;

  // One allocation: `size` bytes at `offset` in `segment`.
  struct Allocation {
    std::shared_ptr<SharedSegment> segment;
    int64_t offset = 0;
    size_t size = 0;
    std::byte* data() const { return segment->data() + offset; }
  };

  // `prefix` must make names the worker accepts: "/ckpt.<tag>.p<pid>." (see SegmentPrefix).
  explicit SharedAllocator(std::string prefix) : prefix_(std::move(prefix)) {}

  // `what` names the tensor in errors.
  absl::StatusOr<Allocation> Allocate(size_t size, absl::string_view what);

  // Registers memory another library placed in the shared-memory file `existing` and mapped
  // at [data, data + size) (see SharedSegment::Link) under a name of this allocator: Find then
  // finds it and a state dict saves and loads it in place. The caller keeps that library's
  // mapping alive as long as the returned Allocation (or a state dict holding it) lives.
  absl::StatusOr<Allocation> Adopt(const std::string& existing, void* data, size_t size,
                                   absl::string_view what);

  // The live segment of this allocator holding all of [data, data + size), if any.
  std::optional<Allocation> Find(const void* data, size_t size) const;

  // The process's allocator ("/ckpt.empty.p<pid>."); a forked child gets a fresh one (segments
  // carry the pid of the process that may register them).
  static SharedAllocator& ForThisProcess();

 private:
  std::string prefix_;
  mutable std::mutex mu_;
  int next_ = 1;
  std::weak_ptr<SharedSegment> arena_;
  size_t arena_used_ = 0;
  // Start address -> segment, for Find. Expired entries are pruned as allocations go on.
  std::map<uintptr_t, std::weak_ptr<SharedSegment>> segments_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_SHARED_MEMORY_H_
