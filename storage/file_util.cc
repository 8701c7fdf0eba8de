#include "storage/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/base/attributes.h"
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

namespace file_util_internal {
// RemoveTree's test seam: called with each directory's path after its entries are listed and
// before they are removed. Weak and empty here; a test that links the testonly
// //storage:remove_tree_test_hook gets that target's definition instead (link-time injection;
// storage/remove_tree_test_hook.cc declares it again, with this signature).
ABSL_ATTRIBUTE_WEAK void RemoveTreeListed(const std::string& /*dir*/) {}
}  // namespace file_util_internal

namespace {

constexpr int kMaxRemoveDepth = 256;

// A directory entry as fstatat(AT_SYMLINK_NOFOLLOW) relative to its open directory saw it.
struct ListedEntry {
  std::string name;
  struct stat st;
};

absl::Status ReplacedError(const std::string& path) {
  return absl::AbortedError(absl::StrCat(
      "not removing ", path,
      ": it was replaced while being removed (by a symlink or another directory); nothing was "
      "removed through it"));
}

// The entries of the open directory `fd` (called `path` in errors), sorted; entries that
// vanish meanwhile are left out.
absl::StatusOr<std::vector<ListedEntry>> ListOpenDir(int fd, const std::string& path) {
  const int listing_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (listing_fd < 0) return ErrnoStatus(errno, absl::StrCat("dup descriptor of ", path));
  DIR* dir = ::fdopendir(listing_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(listing_fd);
    return ErrnoStatus(err, absl::StrCat("opendir ", path));
  }
  ::rewinddir(dir);  // the duplicate shares the offset with `fd`
  std::vector<ListedEntry> out;
  absl::Status status;
  for (;;) {
    errno = 0;
    const struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      if (errno != 0) status = ErrnoStatus(errno, absl::StrCat("readdir ", path));
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    ListedEntry entry{e->d_name, {}};
    if (::fstatat(fd, e->d_name, &entry.st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      status = ErrnoStatus(errno, absl::StrCat("stat ", JoinPath(path, entry.name)));
      break;
    }
    out.push_back(std::move(entry));
  }
  ::closedir(dir);
  if (!status.ok()) return status;
  std::sort(out.begin(), out.end(),
            [](const ListedEntry& a, const ListedEntry& b) { return a.name < b.name; });
  return out;
}

absl::Status RemoveEntryAt(int parent_fd, const ListedEntry& entry, const std::string& path,
                           int depth);

// Removes every entry of the open directory `fd` (called `path`), `depth` levels below the top.
absl::Status RemoveOpenDirContents(int fd, const std::string& path, int depth) {
  CKPT_ASSIGN_OR_RETURN(std::vector<ListedEntry> entries, ListOpenDir(fd, path));
  file_util_internal::RemoveTreeListed(path);
  for (const ListedEntry& entry : entries) {
    CKPT_RETURN_IF_ERROR(RemoveEntryAt(fd, entry, JoinPath(path, entry.name), depth + 1));
  }
  return absl::OkStatus();
}

// Removes `entry` of the open directory `parent_fd`; `path` names it in errors. A directory is
// opened with O_NOFOLLOW and must be the one listed before anything in it is removed.
absl::Status RemoveEntryAt(int parent_fd, const ListedEntry& entry, const std::string& path,
                           int depth) {
  const char* name = entry.name.c_str();
  if (!S_ISDIR(entry.st.st_mode)) {
    if (::unlinkat(parent_fd, name, 0) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("unlink ", path));
    }
    return absl::OkStatus();
  }
  if (depth >= kMaxRemoveDepth) {
    return absl::FailedPreconditionError(absl::StrCat("not removing ", path, ": it is more than ",
                                                      kMaxRemoveDepth, " directory levels deep"));
  }
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();  // gone meanwhile
    if (errno == ELOOP || errno == ENOTDIR) return ReplacedError(path);
    return ErrnoStatus(errno, absl::StrCat("open directory ", path));
  }
  FdCloser closer(fd);
  struct stat opened;
  if (::fstat(fd, &opened) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (opened.st_dev != entry.st.st_dev || opened.st_ino != entry.st.st_ino) {
    return ReplacedError(path);
  }
  CKPT_RETURN_IF_ERROR(RemoveOpenDirContents(fd, path, depth));
  if (::unlinkat(parent_fd, name, AT_REMOVEDIR) != 0) {
    if (errno == ENOENT) return absl::OkStatus();  // moved away meanwhile, emptied
    if (errno == ENOTDIR) return ReplacedError(path);
    return ErrnoStatus(errno, absl::StrCat("rmdir ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  const std::string name = BaseName(path);
  if (name.empty() || name == "." || name == ".." || name == "/") {
    return absl::InvalidArgumentError(
        absl::StrCat("not removing \"", path, "\": it names no directory entry"));
  }
  // The parent is the caller's; only it is resolved by path. O_PATH: search permission is enough.
  const std::string parent = ParentDir(path);
  const int parent_fd = ::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (parent_fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("open directory ", parent));
  }
  FdCloser closer(parent_fd);
  ListedEntry top{name, {}};
  if (::fstatat(parent_fd, name.c_str(), &top.st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  return RemoveEntryAt(parent_fd, top, path, 0);
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

absl::StatusOr<DirListing> ListDirNoFollow(const std::string& path) {
  std::string last = path;  // a trailing '/' would make open() follow a symlink
  while (last.size() > 1 && last.back() == '/') last.pop_back();
  const int fd = ::open(last.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", path));
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  CKPT_ASSIGN_OR_RETURN(std::vector<ListedEntry> listed, ListOpenDir(fd, path));
  auto info = [](std::string name, const struct stat& s) {
    return DirEntryStat{std::move(name), s.st_mode, static_cast<int64_t>(s.st_size), s.st_dev,
                        s.st_ino};
  };
  DirListing out;
  out.self = info(BaseName(path), st);
  out.entries.reserve(listed.size());
  for (ListedEntry& e : listed) out.entries.push_back(info(std::move(e.name), e.st));
  return out;
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
