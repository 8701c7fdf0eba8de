// Paths of the in-memory checkpoint tier: "mem://<name>" names a checkpoint kept in the
// workers' memory (docs/services.md, "In-memory tier") instead of a directory. Pure.
#ifndef CKPT_COMMON_MEMORY_PATH_H_
#define CKPT_COMMON_MEMORY_PATH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

inline constexpr absl::string_view kMemoryPathPrefix = "mem://";
inline constexpr size_t kMaxMemoryNameLength = 128;

// True when `path` starts with "mem://" (whether or not the name is valid).
bool IsMemoryPath(absl::string_view path);

// The name of a memory path: 1-128 characters of letters, digits, '.', '_' and '-', not "."
// or "..". InvalidArgument naming the (escaped, cut) path otherwise, e.g. for a slash.
absl::StatusOr<std::string> MemoryCheckpointName(absl::string_view path);

}  // namespace ckpt

#endif  // CKPT_COMMON_MEMORY_PATH_H_
