// The directories under which a daemon saves, loads and reshards checkpoints
// (--checkpoint_root, repeatable). Every path a remote caller names is resolved here before
// anything touches it: it must be absolute, must not contain "..", and must lie strictly under
// a root after every existing prefix is resolved with realpath (so no symbolic link leads
// out). The resolved, canonical path is what the daemon then uses.
//
// A root may also be an object-store URL, "s3://bucket[/prefix]" (any scheme but file): then
// a URL the caller names is accepted only when it lies strictly under such a root (same scheme
// and bucket, at a '/' boundary) and passes the same syntax checks (common/store_url.h: no
// empty, "." or ".." components); it is returned without a trailing '/'. A URL root is never
// looked up on the filesystem, a plain path never matches a URL root, nor a URL a directory.
//
// Pure: filesystem look-ups only (no gRPC, threads or logging).
#ifndef CKPT_COMMON_CHECKPOINT_ROOTS_H_
#define CKPT_COMMON_CHECKPOINT_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// A set of canonical root directories. Copyable; thread-compatible (const methods only).
class CheckpointRoots {
 public:
  // Each root must be an absolute path to an existing directory, kept canonical (realpath),
  // or an object-store URL, kept in normal form. InvalidArgument naming the bad root, or when
  // `roots` is empty.
  static absl::StatusOr<CheckpointRoots> Create(const std::vector<std::string>& roots);

  // The canonical form of `path` when it lies strictly under a root. `what` names the path in
  // errors ("save path", "reshard source"). InvalidArgument for an empty or relative path or
  // one with a ".." component; PermissionDenied when it (or what a symbolic link in it leads
  // to) lies outside every root. An object-store URL is checked against the URL roots only
  // (InvalidArgument for bad syntax). Errors name the path and the roots.
  absl::StatusOr<std::string> Resolve(absl::string_view path, absl::string_view what) const;

  // Directories (canonical) and URLs (normal form), in the order given.
  const std::vector<std::string>& roots() const { return roots_; }
  // "/a, s3://b/p".
  std::string Describe() const;

 private:
  explicit CheckpointRoots(std::vector<std::string> roots) : roots_(std::move(roots)) {}
  bool Contains(const std::string& canonical) const;
  absl::StatusOr<std::string> ResolveUrl(absl::string_view url, absl::string_view what) const;

  std::vector<std::string> roots_;
};

}  // namespace ckpt

#endif  // CKPT_COMMON_CHECKPOINT_ROOTS_H_
