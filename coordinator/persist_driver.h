// Drives the background persistence of memory checkpoints (mem://<name>) in the coordinator
// daemon, around the pure MemoryPersist (coordinator/memory_persist.h):
// - a memory save that asked for it (persist_to) is queued once it committed (Enqueue);
// - the service's advancer thread runs the steps that touch storage (RunSteps: creating the
//   staging directory, committing it, discarding it), never a gRPC callback thread and never
//   under the service's lock;
// - the workers' WatchWork streams carry each assigned worker a PersistWork naming its files and
//   the staging directory (ItemsFor), and their ReportPersist calls come back (Report);
// - a worker lost (lease expired, deregistered) hands its files to other holders (WorkerFailed);
// - once every file is written the staging directory is committed; the outcome goes into the
//   catalog (persisted / failed), and every holder is sent PersistEnded so it unpins the
//   checkpoint in its memory tier (a pinned checkpoint is never evicted).
// No gRPC calls, threads or logging of its own (RunSteps returns what to log); thread-safe.
#ifndef CKPT_COORDINATOR_PERSIST_DRIVER_H_
#define CKPT_COORDINATOR_PERSIST_DRIVER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/memory_catalog.h"
#include "coordinator/memory_persist.h"
#include "coordinator/staging_journal.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

// What persisting one memory checkpoint was asked to do.
struct PersistRequest {
  std::string name;  // the memory checkpoint (without mem://)
  std::string path;  // resolved storage path
  bool overwrite = false;
  // Started again after a coordinator restart: a checkpoint the previous process committed at
  // `path` already (IsPersistedAt) counts as persisted instead of being written again.
  bool recovered = false;
};

// One work item for a worker, with the key its stream remembers it by (sent once per stream).
struct PersistItem {
  std::string key;
  std::string worker;  // the worker it is for
  pb::WorkItem item;
};

// The driver. See the file comment.
class PersistDriver {
 public:
  // `catalog` must outlive the driver; `keep_newest` is the memory saves' keep-newest (the
  // catalog forgets checkpoints beyond it once their persistence ended).
  // `incarnation` (the coordinator process's, hex) goes into every persistence id, so that a
  // late report of an item a previous coordinator process sent is never taken for one of this
  // process's items (whose ids would otherwise restart at the same numbers).
  PersistDriver(MemoryCatalog* catalog, int keep_newest, std::string incarnation = "")
      : catalog_(catalog), keep_newest_(keep_newest), incarnation_(std::move(incarnation)) {}

  // Records every staging directory in `journal` (may be null; must outlive the driver) from
  // before it is made until it is committed or discarded, so that a coordinator restarted on the
  // same --state_dir removes what a persistence in flight left behind (StagingJournal::Recover).
  void set_journal(StagingJournal* journal) { journal_ = journal; }

  // Queues the persistence of a committed memory checkpoint (its catalog state is persisting).
  void Enqueue(PersistRequest request);
  // Whether RunSteps has storage work queued.
  bool HasSteps() const;
  // Runs the queued storage steps (staging directories created, committed or discarded).
  // Call without other locks held. Returns one line per outcome, for the daemon's log.
  std::vector<std::string> RunSteps();
  // The work items (PersistWork, PersistEnded) for `worker_id` still to deliver whose keys are
  // not in `sent` (a stream sends each key once).
  std::vector<PersistItem> ItemsFor(const std::string& worker_id,
                                    const std::set<std::string>& sent) const;
  // A worker's report. Returns whether the driver changed so that RunSteps or the work streams
  // have something new (wake them).
  bool Report(const std::string& worker_id, const pb::PersistReportRequest& report);
  // `worker_id` is gone: its pending files go to other holders, or the persistence fails.
  // Returns as Report does.
  bool WorkerFailed(const std::string& worker_id, const absl::Status& why);
  // Persistences in flight (for tests and status).
  size_t in_flight() const;

 private:
  enum class Step { kBegin, kRunning, kCommit, kAbort, kBusy };
  struct Flight {
    std::string id;
    PersistRequest request;
    Step step = Step::kBegin;
    std::unique_ptr<MemoryPersist> persist;          // set once begun
    absl::Status failure;                            // why it is aborted
    std::set<std::string> holders;                   // workers that keep (and pin) a copy
    std::string manifest;                            // serialized, sent with every PersistWork
    std::map<std::string, PersistItem> outstanding;  // item key -> its PersistWork
  };

  // The items for `assignment` of `flight`, queued as outstanding. Requires mu_.
  void QueueWork(Flight& flight, const PersistAssignment& assignment);
  // Applies a new assignment (after `failed_worker`, if any, failed: its items are dropped) or
  // a failure to `flight`; true when something changed. Requires mu_.
  bool Apply(Flight& flight, const std::string& failed_worker,
             const absl::StatusOr<PersistAssignment>& next);
  // The staging directory of flight `id` made (and journaled), unlocked.
  absl::StatusOr<std::unique_ptr<MemoryPersist>> BeginStaging(
      const std::string& id, const absl::StatusOr<MemoryCheckpoint>& checkpoint,
      const PersistRequest& request);
  // Begin/commit/abort of one flight, unlocked; returns the log line.
  std::string RunBegin(const std::string& id);
  std::string RunEnd(const std::string& id, Step step);
  // Records the outcome, tells every holder to unpin, forgets the flight. Requires mu_.
  void FinishLocked(Flight& flight, PersistState state, const std::string& detail);

  MemoryCatalog* const catalog_;
  const int keep_newest_;
  const std::string incarnation_;
  StagingJournal* journal_ = nullptr;
  mutable std::mutex mu_;
  std::map<std::string, Flight> flights_;  // by id; guarded by mu_
  std::set<std::string> dead_;             // workers lost; guarded by mu_
  // Worker -> the recent PersistEnded notices for it (the newest 64). Guarded by mu_.
  std::map<std::string, std::deque<PersistItem>> ended_;
  int64_t next_flight_ = 0;  // guarded by mu_
  int64_t next_item_ = 0;    // guarded by mu_
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PERSIST_DRIVER_H_
