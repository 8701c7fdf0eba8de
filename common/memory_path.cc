#include "common/memory_path.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

bool IsMemoryPath(absl::string_view path) { return absl::StartsWith(path, kMemoryPathPrefix); }

absl::StatusOr<std::string> MemoryCheckpointName(absl::string_view path) {
  if (!IsMemoryPath(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(path.substr(0, 200)), "\" is not a mem:// path"));
  }
  const absl::string_view name = path.substr(kMemoryPathPrefix.size());
  const bool bad_char = std::any_of(name.begin(), name.end(), [](char c) {
    return !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-');
  });
  if (name.empty() || name.size() > kMaxMemoryNameLength || bad_char || name == "." ||
      name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory checkpoint name \"", absl::CHexEscape(name.substr(0, kMaxMemoryNameLength)),
        name.size() > kMaxMemoryNameLength ? "...\"" : "\"", " (", name.size(),
        " characters) must be 1-", kMaxMemoryNameLength,
        " characters of letters, digits, '.', '_' and '-' (no slashes)"));
  }
  return std::string(name);
}

}  // namespace ckpt
