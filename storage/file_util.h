// Small POSIX file helpers with absl::Status errors that name the path: bounded whole-file
// reads, directory listing and removal, paths; durable writes and fsync from
// common/durable_file.h.
#ifndef CKPT_STORAGE_FILE_UTIL_H_
#define CKPT_STORAGE_FILE_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/durable_file.h"

namespace ckpt {

// ErrnoStatus, FsyncFd, FsyncDir, WriteFileDurably, WriteFileAtomically and ParentDir come
// from common/durable_file.h (included here).

// Reads a whole file of at most `max_bytes` bytes.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes);

// Reads exactly `length` bytes at `offset`; short files are DataLoss errors ("truncated").
absl::StatusOr<std::string> ReadFileRange(const std::string& path, int64_t offset, int64_t length);

absl::StatusOr<int64_t> FileSize(const std::string& path);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// mkdir (not recursive); an existing directory is an error unless `exist_ok`.
absl::Status MakeDir(const std::string& path, bool exist_ok = false);

// Recursively removes `path` (a file, symlink or directory) by file descriptor, the one
// recursive removal of the project: `path`'s parent is opened, and below it every directory
// is opened relative to its parent's descriptor with O_NOFOLLOW and must be the directory its
// listing saw (st_dev, st_ino); every entry is unlinked relative to its open directory. A
// symlink is removed itself, never followed, so a directory swapped for a symlink (or for
// another directory) meanwhile cannot point the removal outside `path`: that is refused with an
// Aborted error naming the path, and nothing is removed through the swapped-in object. A
// missing `path` is OK; other errors name the path; more than 256 directory levels are refused.
absl::Status RemoveTree(const std::string& path);

// Names in a directory (no "." / ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);

// A directory entry as lstat saw it (a symlink is reported as one, never followed).
struct DirEntryStat {
  std::string name;
  mode_t mode = 0;
  int64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// The directory `path` (`self`) and its entries (no "." / "..", sorted), stat'ed relative to
// the open directory: `path`'s last component is opened with O_NOFOLLOW (a symlink there is an
// error), and `self` identifies what was opened, so a caller can check that it is the directory
// an earlier listing saw (dev, ino) however the path resolved in between.
struct DirListing {
  DirEntryStat self;
  std::vector<DirEntryStat> entries;
};
absl::StatusOr<DirListing> ListDirNoFollow(const std::string& path);

// The last component of `path` (its parent: ParentDir in common/durable_file.h).
std::string BaseName(const std::string& path);
// Joins with one '/'.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ckpt

#endif  // CKPT_STORAGE_FILE_UTIL_H_
