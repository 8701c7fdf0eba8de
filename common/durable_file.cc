#include "common/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status FsyncFd(int fd, absl::string_view path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", path));
  FdCloser closer(fd);
  return FsyncFd(fd, path);
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  FdCloser closer(fd);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return FsyncFd(fd, path);
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  if (absl::Status s = WriteFileDurably(tmp, contents); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(ParentDir(path));
}

}  // namespace ckpt
