// What an overwriting commit may replace: only a committed ckpt checkpoint. Every writer of
// checkpoints (save, import, offline and cluster reshard) commits through
// storage/checkpoint_writer.h, which asks this guard both when it creates the staging
// directory and again right before it swaps the new checkpoint in, so nothing else at the
// destination path (a regular file, a link, an arbitrary or incomplete directory) is ever
// deleted by an overwrite.
#ifndef CKPT_STORAGE_OVERWRITE_GUARD_H_
#define CKPT_STORAGE_OVERWRITE_GUARD_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

// What is at a destination path that passed CheckReplaceable: nothing, or a committed
// checkpoint directory identified by device and inode (so the commit can tell whether the
// directory it swapped out is the one that was checked).
struct ReplaceTarget {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
};

// OK when nothing is at `path`, or when `path` (not following a symbolic link in its last
// component) is a committed ckpt checkpoint: a directory holding only manifest.pb (a regular
// file that parses and validates) and data/ (holding only regular files the manifest lists).
// Otherwise FailedPrecondition naming the path and what it is: "a regular file", "a symbolic
// link to ...", "a directory that is not a ckpt checkpoint (no manifest.pb)", "an incomplete
// checkpoint", "an invalid checkpoint: ...", "a checkpoint directory that also holds ...".
absl::StatusOr<ReplaceTarget> CheckReplaceable(const std::string& path);

// True when `path` is still the directory `target` identified (same device and inode).
bool IsSameTarget(const std::string& path, const ReplaceTarget& target);

}  // namespace ckpt

#endif  // CKPT_STORAGE_OVERWRITE_GUARD_H_
