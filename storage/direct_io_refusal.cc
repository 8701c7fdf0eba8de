#include "storage/direct_io_refusal.h"

#include <fcntl.h>

#include <atomic>
#include <cerrno>

#include "storage/io_lane.h"

namespace ckpt {
namespace {

std::atomic<bool> refuse_direct{false};

}  // namespace

void SetDirectIoRefusedForTesting(bool refused) { refuse_direct = refused; }

namespace io_internal {

// Replaces the weak release definition in storage/io_lane.cc.
int OpenFile(const char* path, int flags, mode_t mode) {
  if ((flags & O_DIRECT) != 0 && refuse_direct) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

}  // namespace io_internal
}  // namespace ckpt
