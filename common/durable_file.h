// Durable and atomic file writes with absl::Status errors that name the path: the fsync of
// files and directories the storage protocol and the daemons' address/ready files rely on.
// No threads or logging.
#ifndef CKPT_COMMON_DURABLE_FILE_H_
#define CKPT_COMMON_DURABLE_FILE_H_

#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// Closes a descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// An absl::Status for errno `err` while doing `what` (e.g. "open data/r0_0.safetensors").
absl::Status ErrnoStatus(int err, absl::string_view what);

// fsync of an open descriptor / of a directory by path (so renames and creations in it are
// durable).
absl::Status FsyncFd(int fd, absl::string_view path);
absl::Status FsyncDir(const std::string& path);

// Writes `contents` to a new file at `path` (truncating), fsyncs it and closes it.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents);

// Replaces `path` with `contents` so that readers see the old file or the whole new one, never
// a part, and the new one survives a crash: writes and fsyncs "<path>.tmp", renames it over
// `path`, fsyncs the directory. The temporary file is removed on failure.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Parent directory of `path` ("." when it has none).
std::string ParentDir(const std::string& path);

}  // namespace ckpt

#endif  // CKPT_COMMON_DURABLE_FILE_H_
