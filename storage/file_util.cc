#include "storage/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace ckpt {
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(path));
  if (size > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", size, " bytes, more than the limit of ", max_bytes));
  }
  return ReadFileRange(path, 0, size);
}

absl::StatusOr<std::string> ReadFileRange(const std::string& path, int64_t offset, int64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  std::string out(static_cast<size_t>(length), '\0');
  int64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd, out.data() + done, length - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " is truncated: wanted bytes [", offset, ", ",
                                              offset + length, "), file ends at ", offset + done));
    }
    done += n;
  }
  return out;
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status MakeDir(const std::string& path, bool exist_ok) {
  if (::mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
  if (errno == EEXIST && exist_ok && IsDirectory(path)) return absl::OkStatus();
  return ErrnoStatus(errno, absl::StrCat("mkdir ", path));
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (S_ISDIR(st.st_mode)) {
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
    for (const std::string& name : names) CKPT_RETURN_IF_ERROR(RemoveTree(JoinPath(path, name)));
    if (::rmdir(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("rmdir ", path));
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unlink ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", path));
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace ckpt
