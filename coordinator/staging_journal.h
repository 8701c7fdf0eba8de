// Staging directories that outlived the write they belonged to, and the coordinator's journal
// that finds the ones a crashed coordinator left behind.
//
// A checkpoint write stages its files in a sibling "<parent>/.<name>.tmp-<pid>-<n>" of the final
// path (storage/checkpoint_writer.h); an aborted write's staging directory is renamed to
// ".<staging name>.discard-<pid>-<n>" and removed. When the writing process dies first, these
// stay forever. Two ways find them:
//  - the coordinator's StagingJournal (--state_dir): before a save or reshard plans (and
//    creates its staging directory) the final path and the coordinator's pid are recorded
//    durably; the record goes when the operation ended. A coordinator starting on the same
//    state directory removes what its predecessor's records point at.
//  - `ckptctl gc DIR...` lists and removes leftovers in the given directories.
// Both remove only directories that are recognisably incomplete ckpt staging directories: the
// name pattern, a real directory (no symlink), only data/r<rank>_<n>.safetensors files and the
// manifest's temporary, and no committed manifest.pb. A staging directory holding manifest.pb
// is a complete checkpoint under a staging name (an interrupted commit or overwrite): it is
// kept and reported, never removed. Anything else is refused. No gRPC, no logging.
#ifndef CKPT_COORDINATOR_STAGING_JOURNAL_H_
#define CKPT_COORDINATOR_STAGING_JOURNAL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::coordinator {

// What a directory entry that looks like a staging leftover is.
enum class LeftoverKind {
  kIncomplete,  // an incomplete ckpt staging directory: removable
  kComplete,    // staging-shaped but holds manifest.pb: kept, reported
  kNotStaging,  // staging-shaped name, but not a ckpt staging directory: refused
};

// One leftover found (and what became of it).
struct StagingLeftover {
  std::string path;
  LeftoverKind kind = LeftoverKind::kNotStaging;
  int64_t bytes = 0;     // sum of the file sizes inside
  pid_t writer_pid = 0;  // from the name (the process that created it)
  std::string detail;    // what it is, why it is kept or refused, or why removing it failed
  bool removed = false;  // set by StagingJournal::Recover
};

// Whether `name` (a directory entry) has the form of a staging or discard directory, and the pid
// in it.
bool IsStagingName(const std::string& name, pid_t* writer_pid = nullptr);

// Classifies `path` (whose name must have the staging form). Never follows symlinks.
StagingLeftover InspectStagingDir(const std::string& path);

// Every entry of `dir` (not recursive) with a staging-form name, classified, sorted by name.
absl::StatusOr<std::vector<StagingLeftover>> FindStagingLeftovers(const std::string& dir);

// Removes an incomplete leftover (renamed aside first, so a writer still at work cannot add to
// what is being removed). FailedPrecondition for any other kind.
absl::Status RemoveStagingLeftover(const StagingLeftover& leftover);

// The coordinator's journal. Thread-safe.
class StagingJournal {
 public:
  // Opens (creating) the journal under `state_dir` and takes its lock (one coordinator per
  // state directory: FailedPrecondition naming the other's pid otherwise).
  static absl::StatusOr<std::unique_ptr<StagingJournal>> Open(const std::string& state_dir);
  ~StagingJournal();

  // Removes the incomplete staging directories recorded by earlier coordinator processes
  // (those of the recorded pid next to each recorded final path) and drops their records.
  // Returns every leftover found, removed or kept, for the log; a record whose leftovers
  // could not be removed (or whose directory could not be listed) stays, and the failure is
  // returned in `detail` with removed == false.
  std::vector<StagingLeftover> Recover();

  // Records, durably, that operation `operation_id` of this process is about to create a
  // staging directory for `final_path`.
  absl::Status Begin(const std::string& operation_id, const std::string& final_path);
  // Drops the record of an operation that ended (committed or discarded). No-op when absent.
  absl::Status End(const std::string& operation_id);

 private:
  StagingJournal(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  std::string EntryPath(const std::string& operation_id) const;

  const std::string dir_;  // <state_dir>/staging
  const int lock_fd_;
  std::mutex mu_;  // serializes the directory fsyncs of Begin/End
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_STAGING_JOURNAL_H_
