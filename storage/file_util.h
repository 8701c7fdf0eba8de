// Small POSIX file helpers with absl::Status errors that name the path: bounded whole-file
// reads, directory listing and removal, paths; durable writes and fsync from
// common/durable_file.h.
#ifndef CKPT_STORAGE_FILE_UTIL_H_
#define CKPT_STORAGE_FILE_UTIL_H_

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

// Recursively removes `path` (file or directory) without following symlinks.
absl::Status RemoveTree(const std::string& path);

// Names in a directory (no "." / ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);

// The last component of `path` (its parent: ParentDir in common/durable_file.h).
std::string BaseName(const std::string& path);
// Joins with one '/'.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ckpt

#endif  // CKPT_STORAGE_FILE_UTIL_H_
