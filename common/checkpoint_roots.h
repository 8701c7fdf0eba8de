// The directories under which a daemon saves, loads and reshards checkpoints
// (--checkpoint_root, repeatable). Every path a remote caller names is resolved here before
// anything touches it: it must be absolute, must not contain "..", and must lie strictly under
// a root after every existing prefix is resolved with realpath (so no symbolic link leads
// out). The resolved, canonical path is what the daemon then uses.
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
  // Each root must be an absolute path to an existing directory; it is kept canonical
  // (realpath). InvalidArgument naming the bad root, or when `roots` is empty.
  static absl::StatusOr<CheckpointRoots> Create(const std::vector<std::string>& roots);

  // The canonical form of `path` when it lies strictly under a root. `what` names the path in
  // errors ("save path", "reshard source"). InvalidArgument for an empty or relative path or
  // one with a ".." component; PermissionDenied when it (or what a symbolic link in it leads
  // to) lies outside every root. Errors name the path and the roots.
  absl::StatusOr<std::string> Resolve(absl::string_view path, absl::string_view what) const;

  const std::vector<std::string>& roots() const { return roots_; }
  // "/a, /b".
  std::string Describe() const;

 private:
  explicit CheckpointRoots(std::vector<std::string> roots) : roots_(std::move(roots)) {}
  bool Contains(const std::string& canonical) const;

  std::vector<std::string> roots_;
};

}  // namespace ckpt

#endif  // CKPT_COMMON_CHECKPOINT_ROOTS_H_
