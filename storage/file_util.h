// Small POSIX file helpers with absl::Status errors that name the path: durable writes,
// fsync of files and directories, bounded whole-file reads, directory removal.
#ifndef CKPT_STORAGE_FILE_UTIL_H_
#define CKPT_STORAGE_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// An absl::Status for errno `err` while doing `what` (e.g. "open data/r0_0.safetensors").
absl::Status ErrnoStatus(int err, absl::string_view what);

// fsync of an open descriptor / of a directory by path (so renames and creations in it are
// durable).
absl::Status FsyncFd(int fd, absl::string_view path);
absl::Status FsyncDir(const std::string& path);

// Writes `contents` to a new file at `path` (truncating), fsyncs it and closes it.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents);

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

// Parent directory of `path` ("." when it has none) and its last component.
std::string ParentDir(const std::string& path);
std::string BaseName(const std::string& path);
// Joins with one '/'.
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ckpt

#endif  // CKPT_STORAGE_FILE_UTIL_H_
