#include "common/checkpoint_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/store_url.h"

namespace ckpt {
namespace {

std::optional<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return std::nullopt;
  return std::string(resolved);
}

// `base` followed by parts[first, last) as path components.
std::string JoinUnder(const std::string& base, const std::vector<std::string>& parts, size_t first,
                      size_t last) {
  std::string out = base;
  for (size_t i = first; i < last; ++i) {
    if (out.empty() || out.back() != '/') out += '/';
    out += parts[i];
  }
  return out;
}

}  // namespace

absl::StatusOr<CheckpointRoots> CheckpointRoots::Create(const std::vector<std::string>& roots) {
  if (roots.empty()) {
    return absl::InvalidArgumentError(
        "no checkpoint root is configured: give --checkpoint_root DIR (repeatable); "
        "checkpoints are saved, loaded and resharded only under these directories");
  }
  std::vector<std::string> canonical;
  for (const std::string& root : roots) {
    if (IsObjectStoreLocation(root)) {  // never realpath'ed: it is not on this filesystem
      absl::StatusOr<std::string> url = NormalizeObjectStoreUrl(root, "checkpoint root");
      if (!url.ok()) return url.status();
      canonical.push_back(*std::move(url));
      continue;
    }
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint root '", root, "' must be an absolute path"));
    }
    std::optional<std::string> real = RealPath(root);
    struct stat st;
    if (!real.has_value() || stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint root '", root, "' is not an existing directory",
                       real.has_value() ? "" : ": ", real.has_value() ? "" : std::strerror(errno)));
    }
    canonical.push_back(*std::move(real));
  }
  return CheckpointRoots(std::move(canonical));
}

std::string CheckpointRoots::Describe() const { return absl::StrJoin(roots_, ", "); }

bool CheckpointRoots::Contains(const std::string& canonical) const {
  for (const std::string& root : roots_) {
    if (IsObjectStoreLocation(root)) continue;  // a path never lies under a URL
    if (root == "/") {
      if (canonical != "/") return true;
    } else if (absl::StartsWith(canonical, root) && canonical.size() > root.size() + 1 &&
               canonical[root.size()] == '/') {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> CheckpointRoots::ResolveUrl(absl::string_view url,
                                                        absl::string_view what) const {
  absl::StatusOr<std::string> normal = NormalizeObjectStoreUrl(url, what);
  if (!normal.ok()) return normal.status();
  for (const std::string& root : roots_) {
    // Both in normal form, so "under, at a '/' boundary" is a prefix test; the bucket is the
    // first component, so the same scheme and bucket follow.
    if (IsObjectStoreLocation(root) && absl::StartsWith(*normal, absl::StrCat(root, "/"))) {
      return normal;
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " '", url, "' is outside the checkpoint roots (", Describe(), ") of this daemon"));
}

absl::StatusOr<std::string> CheckpointRoots::Resolve(absl::string_view path,
                                                     absl::string_view what) const {
  const std::string shown(path);
  const std::string roots = absl::StrCat("the checkpoint roots (", Describe(), ")");
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty; give a path under ", roots));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " contains a NUL byte"));
  }
  if (IsObjectStoreLocation(path)) return ResolveUrl(path, what);
  if (path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", shown, "' is relative; give an absolute path under ", roots));
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", shown, "' contains '..'; give a path under ", roots, " without it"));
    }
    parts.emplace_back(part);
  }
  // The longest prefix that exists, resolved; what follows it does not exist yet.
  size_t existing = parts.size();
  std::optional<std::string> base = RealPath(JoinUnder("/", parts, 0, existing));
  while (!base.has_value() && existing > 0) {
    --existing;
    base = RealPath(JoinUnder("/", parts, 0, existing));
  }
  if (!base.has_value()) base = "/";
  if (existing < parts.size()) {
    // realpath failed on the next component. A symbolic link to nothing must not be followed
    // later (creating a directory through it would create its target wherever it points).
    const std::string next = JoinUnder(*base, parts, existing, existing + 1);
    struct stat st;
    if (lstat(next.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, " '", shown, "' passes through '", next,
                       "', a symbolic link to a missing target; it may not lead out of ", roots));
    }
  }
  const std::string canonical = JoinUnder(*base, parts, existing, parts.size());
  if (!Contains(canonical)) {
    const bool moved = canonical != JoinUnder("/", parts, 0, parts.size());
    return absl::PermissionDeniedError(absl::StrCat(
        what, " '", shown, "' ",
        moved ? absl::StrCat("resolves to '", canonical, "' (through a symbolic link), which ")
              : std::string(),
        "is outside ", roots, " of this daemon"));
  }
  return canonical;
}

}  // namespace ckpt
