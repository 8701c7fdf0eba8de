// The writes of saves whose path is a URL of a checkpoint store other than the filesystem
// (s3://bucket/prefix/name: storage/checkpoint_store.h). The coordinator begins each such
// write before the plan goes out and hands the workers its staging URL; each worker writes its
// data files and joins the write to put them there (CheckpointStore::JoinWrite). Once every
// rank reported, the coordinator adopts each data file the merged manifest lists (the store
// reports its size: a HEAD) and commits the manifest, the store's single commit point. A save
// that does not commit is aborted, which removes every object of the write, the workers' too.
// No gRPC, no logging.
#ifndef CKPT_COORDINATOR_STORE_WRITES_H_
#define CKPT_COORDINATOR_STORE_WRITES_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_store.h"

namespace ckpt::coordinator {

// The store writes in flight, by operation id. Thread-safe.
class StoreWrites {
 public:
  // Begins the write of operation `id` at `url` (once: a second call returns the first's
  // staging URL). The store's errors, naming the URL: AlreadyExists when a checkpoint is
  // committed there and !overwrite.
  absl::StatusOr<std::string> Begin(const std::string& id, const std::string& url, bool overwrite,
                                    absl::Time deadline);
  // The staging URL of operation `id`'s write, or "" when none was begun.
  std::string StagingUrl(const std::string& id) const;
  // Adopts every data file `manifest` lists (written by the workers) and commits the write.
  // FailedPrecondition when `id` has no write; the store's errors naming the URL and object
  // (NotFound for a data file a worker did not put there, FailedPrecondition for another size).
  // The write is forgotten once committed.
  absl::Status Commit(const std::string& id, const pb::Manifest& manifest, absl::Time deadline);
  // Aborts and forgets operation `id`'s write, if it has one that did not commit.
  absl::Status Abort(const std::string& id, absl::Time deadline);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<CheckpointWrite>> writes_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_STORE_WRITES_H_
