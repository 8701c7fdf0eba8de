// ckptctl's offline commands on object-store URLs (s3://bucket/prefix):
//   - a command that reads a checkpoint at a URL (export, diff, reshard's source, inspect,
//     verify) reads it in place through storage/checkpoint_reader.h (ranged GETs of the bytes
//     it needs, checksums verified), with no local copy; the one exception is export --to dcp,
//     whose converter (python/ckpt/interop/dcp.py) opens the data files by path: it first copies
//     the checkpoint (verified) into a private temporary directory (ReadableCheckpoint below),
//     local disk for the whole checkpoint;
//   - a command that writes a checkpoint to a URL (import, reshard's destination) produces it in
//     a private temporary directory with the code that writes directories, then CopyCheckpoint
//     (storage/checkpoint_copy.h) streams it to the URL, verifying every byte against its
//     checksum; the store's own commit protocol (the manifest last) makes it visible, or nothing
//     is.
// The temporary directories (mkdtemp under $TMPDIR, mode 0700) are removed when the objects
// below are destroyed, on success and on error. A directory location is used as it is.
#ifndef CKPT_TOOLS_CKPTCTL_STORE_STAGING_H_
#define CKPT_TOOLS_CKPTCTL_STORE_STAGING_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::ckptctl {

// What --help says about URLs (one paragraph, ending in a blank line).
extern const char kStoreStagingHelp[];

// OK unless `location` (a command's `what`: "source", "output") is an object-store
// URL: files other than a ckpt checkpoint (safetensors, DCP) are read and written only in
// local directories. InvalidArgument naming the URL otherwise.
absl::Status RequireLocal(const std::string& location, const std::string& what);

// A private directory under $TMPDIR (default /tmp), removed with its contents on destruction.
class PrivateTempDir {
 public:
  // `purpose` goes into the name ("ckptctl-<purpose>-XXXXXX").
  static absl::StatusOr<std::unique_ptr<PrivateTempDir>> Create(const std::string& purpose);
  ~PrivateTempDir();
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  explicit PrivateTempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// A checkpoint to read by path (only export --to dcp needs one): a directory as it is, or a
// URL's checkpoint copied into a private temporary directory (kept until this is destroyed).
class ReadableCheckpoint {
 public:
  // Errors name `location`: NotFound when no committed checkpoint is there.
  static absl::StatusOr<std::unique_ptr<ReadableCheckpoint>> Open(const std::string& location);
  // The local directory to read.
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<PrivateTempDir> temp_;
  std::string path_;
};

// A checkpoint to write: a directory as it is, or, for a URL, a directory inside a private
// temporary directory that Publish copies to the URL.
class WritableCheckpoint {
 public:
  // With a URL and without `overwrite`, AlreadyExists naming it when a committed checkpoint is
  // there already (checked before any work; Publish checks again).
  static absl::StatusOr<std::unique_ptr<WritableCheckpoint>> Create(const std::string& location,
                                                                    bool overwrite);
  // Where to write the checkpoint (not existing yet for a URL).
  const std::string& path() const { return path_; }
  const std::string& location() const { return location_; }
  // For a URL: copies the checkpoint written at path() there, verifying it, committed by the
  // store (replacing one there only with `overwrite`). Nothing for a directory.
  absl::Status Publish();

 private:
  std::unique_ptr<PrivateTempDir> temp_;
  std::string location_;
  std::string path_;
  bool overwrite_ = false;
};

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_STORE_STAGING_H_
