// The coordinator's side of persisting a memory checkpoint (mem://<name>) to storage in the
// background, once its memory save committed: an ordinary storage checkpoint is made with the
// storage commit protocol itself (storage/checkpoint_writer.h: CreateStagingDir under the
// overwrite guard, the holders' fsynced data files, CommitCheckpoint of the catalog's manifest:
// directory fsyncs, manifest, atomic rename), so it carries the same guarantees as a direct
// save. Each data file is written by one live holder (the writer's worker first); when a holder
// fails, another holder of the same file takes it over; when none is left the persistence fails
// naming the file and the workers, and the staging directory is discarded (nothing partial is
// ever committed; an earlier checkpoint at the path is untouched). A path that is a store URL
// (s3://...) gets a store write instead of the staging directory (storage/checkpoint_store.h):
// the holders join it and put their files there, and the commit adopts them and PUTs the
// manifest. No gRPC, threads or logging.
#ifndef CKPT_COORDINATOR_MEMORY_PERSIST_H_
#define CKPT_COORDINATOR_MEMORY_PERSIST_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/memory_catalog.h"
#include "storage/checkpoint_store.h"

namespace ckpt::coordinator {

// Worker id -> the data files it is to write.
using PersistAssignment = std::map<std::string, std::vector<std::string>>;

// One writer for each of `files` of `checkpoint`: the first of its holders whose worker is not
// in `excluded` (failed, or lost). FailedPrecondition naming the checkpoint, the file and every
// worker that held it (and which failed) when a file has no such holder.
absl::StatusOr<PersistAssignment> AssignPersistWriters(const MemoryCheckpoint& checkpoint,
                                                       const std::vector<std::string>& files,
                                                       const std::set<std::string>& excluded);

// Whether `path` holds a committed checkpoint with exactly `checkpoint`'s data files and
// pieces (checksums included): a persistence the previous coordinator process committed before
// it stopped, whose end the holders never heard of.
bool IsPersistedAt(const MemoryCheckpoint& checkpoint, const std::string& path);

// One persistence in flight. Thread-compatible (the caller serializes).
class MemoryPersist {
 public:
  // Creates the staging directory beside `path` (AlreadyExists when something is at `path`
  // and not `overwrite`; with `overwrite` only a committed checkpoint may be replaced) and
  // assigns every data file of `checkpoint` to a live holder.
  static absl::StatusOr<std::unique_ptr<MemoryPersist>> Begin(MemoryCheckpoint checkpoint,
                                                              const std::string& path,
                                                              bool overwrite);
  ~MemoryPersist();  // discards the staging directory unless committed

  const std::string& path() const { return path_; }
  const std::string& staging_dir() const { return staging_dir_; }
  const MemoryCheckpoint& checkpoint() const { return checkpoint_; }
  // The files each worker still has to write (what to send the workers now).
  PersistAssignment pending() const;

  // `worker` reports on `files`: OK marks them written; an error hands them, and whatever else
  // was pending on `worker`, to other holders, returned as the new work to send.
  // FailedPrecondition naming every file without a holder left, the workers and the failures
  // (then Abort). Files not pending on `worker` are ignored (a late report).
  absl::StatusOr<PersistAssignment> Report(const std::string& worker,
                                           const std::vector<std::string>& files,
                                           const absl::Status& result);
  // A worker lost (lease expired): its pending files go to other holders, as in Report.
  absl::StatusOr<PersistAssignment> WorkerFailed(const std::string& worker,
                                                 const absl::Status& why);
  // True once every data file was written.
  bool AllWritten() const { return writer_of_.empty(); }
  // Commits the staging directory at the path with the catalog's manifest (FailedPrecondition
  // while files are pending).
  absl::Status Commit();
  // Discards the staging directory (a failed persistence); idempotent.
  absl::Status Abort();

 private:
  MemoryPersist() = default;
  // For a store URL (s3://...): begins the store write the holders join; its staging URL.
  absl::StatusOr<std::string> BeginStoreWrite(const std::string& url, bool overwrite);
  // Adopts the holders' objects and commits the store write with the catalog's manifest.
  absl::Status CommitStoreWrite();
  // How long one store request of a persistence may take.
  static constexpr absl::Duration kStoreTimeout = absl::Minutes(10);

  MemoryCheckpoint checkpoint_;
  std::string path_;
  bool overwrite_ = false;
  std::string staging_dir_;  // a staging directory, or a store write's staging URL
  std::unique_ptr<CheckpointWrite> store_write_;  // a persistence to a store URL
  bool finished_ = false;                         // committed or discarded
  std::map<std::string, std::string> writer_of_;  // pending data file -> worker writing it
  std::set<std::string> failed_;                  // workers that failed
  std::map<std::string, std::string> failures_;   // worker -> why
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_MEMORY_PERSIST_H_
