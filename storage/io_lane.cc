#include "storage/io_lane.h"

#include <fcntl.h>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace io_internal {

// Weak: the testonly //storage:direct_io_refusal links a replacement (see io_lane.h).
ABSL_ATTRIBUTE_WEAK int OpenFile(const char* path, int flags, mode_t mode) {
  return ::open(path, flags, mode);
}

absl::Status ValidateOptions(const IoOptions& o) {
  if (o.num_threads < 1 || o.queue_depth < 1 || o.buffer_bytes < kAlign ||
      o.buffer_bytes % kAlign != 0 || o.buffer_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad I/O options: num_threads ", o.num_threads, ", queue_depth ", o.queue_depth,
        ", buffer_bytes ", o.buffer_bytes, " (must be a multiple of 4096 up to 1 GiB)"));
  }
  if (o.backend == IoBackend::kUring && !UringAvailable()) {
    return absl::UnavailableError("io_uring was requested but is not available here");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IoQueue>> MakeQueue(const IoOptions& o) {
  if (o.backend != IoBackend::kPosix && UringAvailable()) {
    auto q = MakeUringQueue(o.queue_depth);
    if (q.ok() || o.backend == IoBackend::kUring) return q;
  }
  return MakePosixQueue();
}

bool IsDirectRefused(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition &&
         s.message().find("O_DIRECT refused") != absl::string_view::npos;
}
}  // namespace io_internal
}  // namespace ckpt
