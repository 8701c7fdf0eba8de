// The coordinator's catalog of the in-memory checkpoint tier: for each memory checkpoint
// (mem://<name>) committed by a memory save, its manifest (the content a storage save of the
// same state would commit) and which workers hold a copy of each data file. A worker whose
// lease was lost loses its copies here; what remains decides whether, and from whom, a load
// can read each file. Pure: no gRPC, threads or logging; thread-safe.
#ifndef CKPT_COORDINATOR_MEMORY_CATALOG_H_
#define CKPT_COORDINATOR_MEMORY_CATALOG_H_

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// A worker holding (or having held) a copy of a data file.
struct MemoryHolder {
  std::string worker_id;
  std::string host;
  bool evicted = false;   // lost because the worker evicted it (its memory budget)
  bool recorded = false;  // the worker keeps the checkpoint's record (RecordsFor skips it)
  // "worker w-2 on host b" (", which evicted it" when evicted)
  std::string DebugString() const;
};

// Where a memory checkpoint's background persistence to storage stands.
enum class PersistState {
  kNotAsked,    // never to be persisted
  kPersisting,  // asked for; not committed to storage yet (never evicted meanwhile)
  kPersisted,   // committed at persist_to as an ordinary checkpoint
  kFailed,      // gave up (persist_detail says why); evictable again
};

// "persisting to /p", "persisted to /p", "persist to /p failed: why", "" when not asked.
std::string PersistDescription(PersistState state, const std::string& path,
                               const std::string& detail);

// One memory checkpoint.
struct MemoryCheckpoint {
  std::string name;
  pb::Manifest manifest;
  std::map<std::string, std::vector<MemoryHolder>> holders;  // data file -> live copies
  std::map<std::string, std::vector<MemoryHolder>> lost;     // data file -> copies lost
  absl::Time committed;
  int64_t bytes = 0;       // one copy of every data file
  int64_t sequence = 0;    // commit order (set by the catalog)
  std::string persist_to;  // storage path of the asked-for persistence ("" when not asked)
  bool persist_overwrite = false;
  PersistState persist_state = PersistState::kNotAsked;
  std::string persist_detail;  // why it failed
  // A published transfer version (coordinator/transfer_registry.h): its name and version.
  std::string published_name;
  int64_t published_version = 0;
  // Rebuilt after a coordinator restart while its persistence was in flight: it is started
  // again (TakeRecoveredPersists) once every data file has a holder again.
  bool persist_recovery = false;
  // Rebuilt from the workers' reports after a coordinator restart (its lost copies are unknown).
  bool rebuilt = false;
};

// The retention group `checkpoint` is counted in by keep-newest: "xfer:<name>" for the published
// versions of transfer name <name>, "" for plain memory checkpoints (SavePlanPart.retention_group).
std::string RetentionGroup(const MemoryCheckpoint& checkpoint);
std::string RetentionGroupOfPublished(const std::string& published_name);

// What the workers holding `checkpoint` keep of it (WorkItem.memory_record).
pb::MemoryCheckpointRecord RecordOf(const MemoryCheckpoint& checkpoint);

// A record to deliver to a holder, with the key its work stream remembers it by.
struct RecordItem {
  std::string key;
  pb::MemoryCheckpointRecord record;
};

// The catalog.
class MemoryCatalog {
 public:
  // Claims `name` for save `operation_id` before it is planned: AlreadyExists naming the
  // checkpoint when it is committed, or claimed by another save in flight.
  absl::Status Claim(const std::string& name, const std::string& operation_id);
  // Gives up the claim of a save that did not commit (no-op for another operation's claim).
  void Release(const std::string& name, const std::string& operation_id);
  // Records the committed checkpoint (the claim of `operation_id` ends), then forgets the
  // committed checkpoints of its retention group older than the group's newest `keep_newest`
  // (the workers evict them when this one is complete on them; 0: keep all). Returns the names
  // forgotten.
  absl::StatusOr<std::vector<std::string>> Commit(const std::string& operation_id,
                                                  MemoryCheckpoint checkpoint, int keep_newest = 0);
  // Before a save into retention `group` that keeps the newest `keep_newest` (0: all) is
  // planned: ResourceExhausted naming the checkpoint and its storage path when committing one
  // more would have to forget a checkpoint of the group still being persisted (it is evicted
  // only once persisted).
  absl::Status CheckRoomForOneMore(int keep_newest, const std::string& group = "") const;
  // Records how the persistence of `name` stands; NotFound for an unknown name. Once it ended
  // (persisted or failed), checkpoints beyond the newest `keep_newest` are forgotten as in
  // Commit; returns their names.
  absl::StatusOr<std::vector<std::string>> SetPersistState(const std::string& name,
                                                           PersistState state,
                                                           const std::string& detail,
                                                           int keep_newest = 0);
  // Drops every copy `worker_id` held; returns the names of the checkpoints that lost some.
  std::vector<std::string> DropWorker(const std::string& worker_id);
  // `worker_id` evicted `names` from its memory tier: its copies of them are lost (marked
  // evicted). Returns the names of the checkpoints that lost some.
  std::vector<std::string> DropEvicted(const std::string& worker_id,
                                       const std::vector<std::string>& names);
  // The records of the committed checkpoints `worker_id` holds files of and has no record of
  // yet, whose keys are not in `sent` (each work stream sends each key once).
  std::vector<RecordItem> RecordsFor(const std::string& worker_id,
                                     const std::set<std::string>& sent) const;
  // Rebuilds the catalog from what a (re-)registering worker reports it holds: each complete
  // copy with a record is counted as a copy of its checkpoint (recreated from the record when
  // the catalog does not know it: after a coordinator restart the workers are the source of
  // truth). A copy is refused (and logged) when it has no record (its commit was never
  // recorded there), its manifest differs from the catalog's, or a save in flight claims the
  // name. A checkpoint that was being persisted is marked for recovery. Returns one log line
  // per checkpoint reported.
  std::vector<std::string> Adopt(
      const std::string& worker_id, const std::string& host,
      const google::protobuf::RepeatedPtrField<pb::HeldMemoryCheckpoint>& held);
  // The checkpoints marked for persistence recovery whose every data file has a holder again
  // (all of them when `even_uncovered`: the wait for their holders is over); their mark is
  // cleared.
  std::vector<std::string> TakeRecoveredPersists(bool even_uncovered);
  // The checkpoint, or NotFound naming it: when retention (keep-newest) forgot it, the message
  // says so (when, by which keep, the newest kept, where it was persisted) and to save it
  // again; otherwise that no memory save committed it.
  absl::StatusOr<MemoryCheckpoint> Find(const std::string& name) const;

  // Forgotten checkpoints remembered for Find's message (the oldest forgotten first past it).
  static constexpr size_t kMaxEvictionsRemembered = 4096;
  // Every checkpoint, by name, for `ckptctl status`.
  void ToProto(google::protobuf::RepeatedPtrField<pb::MemoryCheckpointStatus>* out) const;

 private:
  // Why a checkpoint is no longer in the catalog: keep-newest forgot it.
  struct Eviction {
    absl::Time when;
    int keep_newest = 0;
    std::string group;         // RetentionGroup
    std::string newest;        // the group's newest checkpoint then
    std::string persisted_to;  // its storage copy, when its persistence committed
    int64_t order = 0;         // in eviction_order_
  };

  mutable std::mutex mu_;
  std::map<std::string, MemoryCheckpoint> committed_;  // guarded by mu_
  // Forgotten by keep-newest, at most kMaxEvictionsRemembered; guarded by mu_.
  std::map<std::string, Eviction> evicted_;
  std::map<int64_t, std::string> eviction_order_;  // order -> name; guarded by mu_
  int64_t next_eviction_ = 0;                      // guarded by mu_
  std::map<std::string, std::string> claims_;      // name -> operation; guarded by mu_
  // Worker -> committed checkpoints it holds files of without their record; guarded by mu_.
  std::map<std::string, std::set<std::string>> unrecorded_;
  // Adopts one reported copy; returns its log line. Requires mu_.
  std::string AdoptLocked(const std::string& worker_id, const std::string& host,
                          const pb::HeldMemoryCheckpoint& held);
  // Forgets committed checkpoints of `group` beyond its newest `keep_newest`, never one being
  // persisted. Each is remembered in evicted_.
  std::vector<std::string> ForgetBeyondLocked(int keep_newest, const std::string& group);
  // Find's NotFound message for `name`, forgotten as `eviction` says.
  static std::string EvictedMessage(const std::string& name, const Eviction& eviction);
  // Remembers that keep-newest forgot `checkpoint`. Requires mu_.
  void RememberEvictionLocked(const MemoryCheckpoint& checkpoint, int keep_newest,
                              const std::string& newest);
  // Moves `worker_id`'s copies of `checkpoint` to its lost ones; whether it held any.
  static bool DropHolderLocked(MemoryCheckpoint& checkpoint, const std::string& worker_id,
                               bool evicted);

  int64_t next_sequence_ = 0;  // commit order; guarded by mu_
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_MEMORY_CATALOG_H_
