// SharedSegment::Link: a second name for shared memory another library created and mapped.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/shared_memory.h"

namespace ckpt::client {
namespace {

// Where shm_open's names live on Linux.
std::string ShmPath(const std::string& name) { return "/dev/shm" + name; }

// Whether this process maps `path` MAP_SHARED read-write at `data` from file offset 0 over at
// least `size` bytes (one /proc/self/maps line; the kernel splits nothing of a fresh mapping).
bool MapsSharedFileAt(const std::string& path, const void* data, size_t size) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const uintptr_t want = reinterpret_cast<uintptr_t>(data);
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    unsigned long long offset = 0;
    char perms[8] = {0};
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %7s %llx %*s %*s %n", &begin, &end,
                    perms, &offset, &consumed) < 4 ||
        begin != want) {
      continue;
    }
    const std::string mapped = consumed > 0 ? line.substr(consumed) : "";
    return mapped == path && offset == 0 && perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's' &&
           end - begin >= size;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Link(const std::string& existing,
                                                                   const std::string& name,
                                                                   void* data, size_t size,
                                                                   absl::string_view what) {
  const auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("tensor ", what,
                                                      ": cannot share the shared-memory file ",
                                                      existing, " with the worker: ", why));
  };
  if (existing.empty() || existing[0] != '/' || existing.find('/', 1) != std::string::npos) {
    return refuse("not a shared-memory name (\"/name\")");
  }
  struct stat st;
  if (stat(ShmPath(existing).c_str(), &st) != 0) return refuse(std::strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return refuse("not a regular file of this user");
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    return refuse(absl::StrCat("it holds ", st.st_size, " bytes, not ", size));
  }
  if (data == nullptr || !MapsSharedFileAt(ShmPath(existing), data, size)) {
    return refuse("this process does not map it shared at the tensor's address");
  }
  if (link(ShmPath(existing).c_str(), ShmPath(name).c_str()) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor ", what, ": cannot link ", existing,
                                                     " as ", name, ": ", std::strerror(errno)));
  }
  return std::shared_ptr<SharedSegment>(
      new SharedSegment(name, static_cast<std::byte*>(data), size, /*owns_mapping=*/false));
}

}  // namespace ckpt::client
