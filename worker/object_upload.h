// A rank's part of a save to a checkpoint store URL (s3://...): the coordinator hands the
// workers the staging URL of the store write it began (coordinator/store_writes.h). The worker
// writes its data files as for any save, into a private scratch directory on its own disk
// (ScratchDir), then joins the store write and uploads each file into it
// (UploadDataFiles: CheckpointStore::JoinWrite, one ObjectWriter per file, multipart with parts
// in flight for large ones). The scratch directory is removed whatever happens. No gRPC, no
// logging.
#ifndef CKPT_WORKER_OBJECT_UPLOAD_H_
#define CKPT_WORKER_OBJECT_UPLOAD_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/manifest.pb.h"

namespace ckpt::worker {

// A private directory made under a root (mkdtemp), removed with everything in it on
// destruction. Move-only.
class ScratchDir {
 public:
  // Makes "<root>/ckpt-upload-<who>-XXXXXX" ("" root: $TMPDIR, else /tmp) with data/ in it, as
  // a staging directory has. Errors name the root.
  static absl::StatusOr<ScratchDir> Create(const std::string& root, const std::string& who);
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ~ScratchDir();
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Uploads every data file `written` lists (names relative to `dir`) into the store write whose
// staging URL is `staging_url`, checking each file holds the size the record says. Stops with
// Cancelled once `cancelled` says so (checked between reads). Errors name `who`, the URL and
// the object.
absl::Status UploadDataFiles(const std::string& dir, const pb::Manifest& written,
                             const std::string& staging_url, absl::Time deadline,
                             const std::function<bool()>& cancelled, const std::string& who);

// Called before a rank's upload starts; false stops it (Cancelled). `cancelled` says whether
// the operation was aborted meanwhile. Injected at link time: the release definition
// (object_upload.cc) is weak and returns true at once; the testonly daemon
// //worker:ckpt_worker_testing links worker/test_hooks_on.cc, whose definition
// (--upload_gate_file=FILE) creates FILE.waiting and waits until FILE exists, so a test can
// kill the object store's server between a rank's local write and its upload.
bool PassUploadGateForTest(const std::function<bool()>& cancelled);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_OBJECT_UPLOAD_H_
