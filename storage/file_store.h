// The filesystem checkpoint store (storage/checkpoint_store.h) for plain paths and file:// URLs:
// a checkpoint is a directory, written into a staging sibling and committed by the protocol of
// storage/checkpoint_writer.h (fsync every file and directory, manifest.pb last, then one
// rename, or RENAME_EXCHANGE when overwriting). Local I/O ignores deadlines.
//
// A write's staging_url is its staging directory's absolute, resolved path
// (<parent>/.<name>.tmp-<pid>-<n>). JoinWrite takes exactly such a path and nothing else (an
// absolute path without "."/".."/empty components or symlinks, named as CreateStagingDir names
// its siblings, holding data/), and is NotFound once the directory is gone (committed:
// renamed into place; aborted: discarded). Joined writes create files in its data/ with O_EXCL;
// Adopt stats them, and the commit stats every data file again right before the rename.
#ifndef CKPT_STORAGE_FILE_STORE_H_
#define CKPT_STORAGE_FILE_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// The path of a plain path or file:// URL ("file:///ckpts/a" -> "/ckpts/a"); InvalidArgument
// for another scheme, a file:// URL naming a host, or an empty path.
absl::StatusOr<std::string> FileStorePath(absl::string_view url);

// The "file" store. Registered under "file" by file_store.cc.
std::unique_ptr<CheckpointStore> MakeFileStore();

}  // namespace ckpt

#endif  // CKPT_STORAGE_FILE_STORE_H_
