// The coordinator's job and operation state machine: which trainer ranks form each job, and
// how each save/load/reshard operation moves through its phases
//
//   gathering (ranks join with their shard metadata)
//     -> planning (every rank arrived; the service runs the planner)
//     -> executing (workers run their plan parts and report progress and results)
//     -> committing (save/reshard: every rank wrote its data; the manifest is being committed)
//     -> done | aborted
//
// A rank that does not join within the arrival deadline, a worker that loses its lease, a
// failed rank result or an operation that overruns its execution deadline aborts the
// operation for every rank with one status naming the rank, host and cause; an aborted
// operation can never reach committing or done. Once in committing, every rank's data is
// written and the commit is the coordinator's own step: only FinishCommit ends it.
//
// Pure: no gRPC, threads or logging; time comes from the injected Clock. Not thread-safe:
// the service shell serializes calls.
#ifndef CKPT_COORDINATOR_JOB_STATE_H_
#define CKPT_COORDINATOR_JOB_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/plan_part_bytes.h"
#include "planner/rank_pieces.h"
#include "proto/types.pb.h"

namespace ckpt::coordinator {

// What an operation does with a checkpoint directory.
enum class OperationKind { kSave, kLoad, kReshard };

// Where an operation is in its life. kDone and kAborted are final.
enum class Phase { kGathering, kPlanning, kExecuting, kCommitting, kDone, kAborted };

// "save", "load", "reshard".
absl::string_view OperationKindName(OperationKind kind);
// Inverse of OperationKindName; InvalidArgument naming the valid kinds otherwise.
absl::StatusOr<OperationKind> ParseOperationKind(absl::string_view name);
// "gathering", "planning", "executing", "committing", "done", "aborted".
absl::string_view PhaseName(Phase phase);
inline bool IsFinal(Phase phase) { return phase == Phase::kDone || phase == Phase::kAborted; }

// The worker daemon (and machine) that serves one trainer rank.
struct RankLocation {
  std::string worker_id;
  std::string host;
  int64_t worker_pid = 0;
  int gpu = -1;       // the GPU the worker serves (-1: none)
  bool nccl = false;  // the worker can create an NCCL communicator on it

  // "host h, worker w-2 (pid 123)", or "no worker attached" when empty.
  std::string DebugString() const;

  friend bool operator==(const RankLocation& a, const RankLocation& b) {
    return a.worker_id == b.worker_id && a.host == b.host && a.worker_pid == b.worker_pid &&
           a.gpu == b.gpu && a.nccl == b.nccl;
  }
};

// A named group of world_size trainer ranks.
struct Job {
  std::string name;
  int world_size = 0;
  // Ranks whose trainer has attached, by rank (a B-tree: at 100k ranks a join's lookup in a
  // red-black tree was a chain of cache misses).
  absl::btree_map<int, RankLocation> ranks;
  // Ranks whose trainer attached and then left (DetachRank) and has not attached again: where
  // it was and when it left (at most world_size entries).
  struct Departed {
    RankLocation location;
    absl::Time left;
  };
  absl::btree_map<int, Departed> departed;
  absl::Time created;
};

// One rank's part in one operation.
struct RankEntry {
  bool joined = false;
  RankLocation location;
  absl::Time joined_at;
  // The rank's shard metadata, as gathered: a piece list shared with every rank that described
  // the same pieces (replica ids and flat ranges aside; interned by JobState) plus the rank's
  // own replica ids and flat ranges (planner/rank_pieces.h). shards.Piece(i) is piece i.
  RankPieces shards;
  std::vector<pb::MemoryKind> memory_kinds;  // where each shard lives (parallel; may be empty)
  std::vector<pb::TensorLayout> layouts;     // how the rank described them (informational)
  std::vector<int64_t> mesh_shape;
  // SHA-256 of the rank's description as the coordinator computed it ("" when its worker sent
  // no digest): a repeat save whose digests all match reuses the job's save plan.
  std::string description_digest;
  // The body of a save plan part the rank's worker said it keeps (PlanPartBytes::body_id; ""
  // none): a reused plan's part whose body this is goes by reference (only its tail).
  std::string held_plan_part_body;
  bool has_plan = false;
  PlanPartBytes plan_part;  // opaque serialized plan part for this rank's worker (shared)
  int64_t bytes_total = 0;  // bytes this rank moves under the plan
  int64_t bytes_done = 0;
  std::optional<absl::Status> result;  // set once the rank reported
  std::string written;     // opaque record of what the rank wrote (save), kept for the commit
  int64_t bytes_read = 0;  // load: bytes the rank read from storage
  // A receive's serving participant (coordinator/transfer_kinds.h): a rank past the job's
  // world size, added by SetPlan, served by a source worker with no trainer; its work items
  // have kind OPERATION_RECEIVE and name `serving_source`.
  bool serving = false;
  std::string serving_source;
};

// What a reshard executed on the workers reads and how (Operation::path is the destination).
struct ReshardSpec {
  std::string source;               // the committed checkpoint to read
  std::string layout_json;          // the target layout (planner/layout_spec.h)
  bool overwrite = false;           // replace an existing checkpoint at the destination
  int64_t memory_budget_bytes = 0;  // per rank; 0: the planner's default
};

// A save, load or reshard of one job (or, for reshards on the cluster, of a job created for
// it: "reshard:<destination>").
struct Operation {
  // "op-<incarnation>-<n>": unique across coordinator restarts ("op-<n>" without one).
  std::string id;
  std::string job;
  OperationKind kind = OperationKind::kSave;
  std::string path;
  std::string requested_by;                     // "operator" or "rank <r>"
  std::map<std::string, std::string> metadata;  // user metadata (first rank to give any)
  // Load options of the trainers (first rank to give any); empty/0: the coordinator's default.
  pb::LoadAlgorithm load_algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED;
  int64_t load_memory_budget_bytes = 0;
  int memory_replicas = -1;  // memory saves: the trainers' replication factor (-1: default)
  // Memory saves: persist to this storage path once committed ("": never; first rank decides).
  std::string persist_to;
  bool persist_overwrite = false;
  // Process groups (planner/process_groups.h spec text; "": one group of every rank): the
  // operator's, else the first rank's to give any (coordinator/group_plan.h resolves them).
  std::string process_groups;
  // Storage saves: compression spec of the data files (storage/piece_codec.h; "": raw): the
  // operator's, else the first rank's to give one.
  std::string compression;
  // Storage saves: the commit may replace a committed checkpoint at `path` (the operator's or
  // any rank's request; coordinator/save_commit.h).
  bool overwrite = false;
  ReshardSpec reshard;  // kReshard only
  int world_size = 0;
  Phase phase = Phase::kGathering;
  absl::Time created;
  absl::Time phase_since;
  absl::Time deadline;           // the current phase must end by then (InfiniteFuture: none)
  std::vector<RankEntry> ranks;  // indexed by rank
  absl::Status status;           // OK unless aborted; the diagnosis every rank receives
  absl::Time finished;           // when the phase became final
  // Running totals over `ranks`, kept by JobState as ranks join, plans are set and ranks
  // report, so that answering a call with the operation's status is O(1), not O(ranks)
  // (which made a 100k-rank gather quadratic). An Operation built by hand has zeros here.
  struct Totals {
    int joined = 0;
    int reported = 0;
    int64_t bytes_done = 0;
    int64_t bytes_total = 0;
    int64_t bytes_read = 0;
  } totals;
  // Ranks that joined with only the digest of their unchanged description (gather skipped).
  int ranks_described_by_digest = 0;
  bool plan_reused = false;  // SetPlan was given a reused plan (RankPlan::reused)
  // Receives: serving participants SetPlan added past world_size (ranks.size() = world_size +
  // serving_ranks once planned).
  int serving_ranks = 0;
  int64_t received_version = 0;  // receives: the version resolved at planning (RankPlan)

  int JoinedRanks() const;
  int ReportedRanks() const;
  int64_t BytesDone() const;
  int64_t BytesTotal() const;
  int64_t BytesRead() const;  // load: bytes all ranks read from storage
  // "op-3 (save of /ckpt/step100, job gpt)".
  std::string DebugString() const;
};

// A rank joining an operation with its shard metadata.
struct JoinRequest {
  std::string job;
  int world_size = 0;
  int rank = 0;
  OperationKind kind = OperationKind::kSave;
  std::string path;
  RankLocation location;
  std::vector<pb::PieceMeta> shards;
  // `shards` already split into layout classes (ToJoinRequest does it outside the service
  // lock); when it is empty, Join splits `shards`. Join interns its list either way.
  RankPieces pieces;
  std::vector<pb::MemoryKind> memory_kinds;  // parallel to shards (empty: not said)
  std::vector<pb::TensorLayout> layouts;     // informational, for the manifest's saved layout
  std::vector<int64_t> mesh_shape;
  std::map<std::string, std::string> metadata;  // user metadata for the manifest (step, ...)
  pb::LoadAlgorithm load_algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED;  // load (0: default)
  int64_t load_memory_budget_bytes = 0;  // load: bytes in flight per rank (0 = default)
  int memory_replicas = -1;              // memory save: extra copies of each file (-1: default)
  std::string persist_to;                // memory save: background persistence path ("": none)
  bool persist_overwrite = false;
  std::string process_groups;  // spec text ("": one group of every rank)
  std::string compression;     // save: compression spec ("": raw), checked by the caller
  bool overwrite = false;      // storage save: may replace a committed checkpoint (checked)
  // Arrival deadline of an operation this join creates, capped by the coordinator's (zero:
  // the coordinator's).
  absl::Duration arrival_deadline = absl::ZeroDuration();
  // When set, the operation the rank means to join (e.g. one an operator requested and
  // the trainer learned of through Poll); joining anything else is an error.
  std::string operation_id;
  // The rank sent only the digest of its unchanged description; shards, layouts and the rest
  // come from the description the coordinator kept. Counted in ranks_described_by_digest.
  bool described_by_digest = false;
  std::string description_digest;   // see RankEntry::description_digest
  std::string held_plan_part_body;  // see RankEntry::held_plan_part_body
};

// A rank's plan part, handed to SetPlan.
struct RankPlan {
  RankPlan() = default;
  RankPlan(std::string part_in, int64_t bytes_in) : part(std::move(part_in)), bytes(bytes_in) {}

  // The serialized part, shared with whoever else holds it (e.g. the job's kept save plan).
  PlanPartBytes part;
  int64_t bytes = 0;
  // Plans past the world size only: the serving participant's worker (see RankEntry::serving)
  // and what it serves, for messages.
  std::optional<RankLocation> serving;
  std::string serving_source;
  // Set on any part: the plan was reused from an earlier operation (reported in the status).
  bool reused = false;
  // Set on any part of a receive: the published version it delivers (reported in the status).
  int64_t received_version = 0;
};

// Deadlines and retention of the state machine.
struct JobStateOptions {
  // Gathering: every rank must join within this long of the operation's creation.
  absl::Duration arrival_deadline = absl::Seconds(60);
  // Planning + executing must finish within this long of the last rank's arrival.
  absl::Duration execution_deadline = absl::Minutes(30);
  // Finished operations remembered per job (for status queries), newest kept.
  int finished_operations_kept = 32;
};

// The state machine itself. See the file comment.
class JobState {
 public:
  // `incarnation` (hex; may be empty) is part of every operation id handed out, so that ids of
  // an earlier coordinator process never name one of this one's.
  JobState(const Clock* clock, JobStateOptions options, std::string incarnation = "");

  const JobStateOptions& options() const { return options_; }

  // Records that `rank`'s trainer is served by `location`, creating the job on first use.
  // FailedPrecondition if the job exists with another world size while some rank is still
  // attached or an operation is in flight (a job whose ranks all left may come back with
  // another world size); AlreadyExists when the rank is attached through another worker (two
  // trainers claim one rank); InvalidArgument for a rank outside [0, world_size).
  absl::Status AttachRank(absl::string_view job, int world_size, int rank,
                          const RankLocation& location);

  // The trainer of `rank` left the worker `worker_id` (Goodbye, death). Ignored when the rank
  // is attached elsewhere by now. The rank is remembered as departed (DescribeRank says where
  // it was and when it left). An operation of the job still gathering that the rank had not
  // joined cannot complete: it is aborted now (Unavailable naming the rank, its worker and
  // when it left) rather than at its arrival deadline; returns its id. A rank that joined
  // already reports through its worker.
  std::vector<std::string> DetachRank(absl::string_view job, int rank, absl::string_view worker_id);

  // An operator asks the ranks of `job` to save/load at their next Poll. The job must
  // exist (its world size is known) and have no operation in flight. `arrival_deadline`
  // (when positive) replaces the default: trainers only notice at their next step.
  // A load's exchange algorithm and memory budget, when given, override the trainers'.
  absl::StatusOr<std::string> RequestOperation(
      absl::string_view job, OperationKind kind, absl::string_view path,
      absl::Duration arrival_deadline,
      pb::LoadAlgorithm load_algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED,
      int64_t load_memory_budget_bytes = 0, const std::string& process_groups = "");
  // Sets where the memory save `operation_id` (requested, not yet planned) persists to.
  absl::Status SetPersistTo(absl::string_view operation_id, std::string path, bool overwrite);
  // Sets the extra copies of the memory save `operation_id` (requested, not yet planned).
  absl::Status SetMemoryReplicas(absl::string_view operation_id, int replicas);
  // Sets the compression spec of the save `operation_id` (requested, not yet planned).
  absl::Status SetCompression(absl::string_view operation_id, std::string spec);
  // Lets the storage save `operation_id` (requested, not yet planned) replace a committed
  // checkpoint at its path.
  absl::Status SetOverwrite(absl::string_view operation_id);

  // An operator starts a reshard executed on the workers: a job "reshard:<destination>" of
  // `locations.size()` ranks (rank r served by locations[r]) whose operation skips gathering
  // (the ranks have no trainers) and enters planning at once. FailedPrecondition when a
  // reshard into the same destination is in flight; InvalidArgument for an empty source,
  // destination or rank list, or a rank without a worker.
  absl::StatusOr<std::string> StartReshard(absl::string_view destination, ReshardSpec spec,
                                           const std::vector<RankLocation>& locations);

  // The operator-requested operation of `job` that `rank` has not joined yet, if any.
  const Operation* PendingForRank(absl::string_view job, int rank) const;

  // A rank joins the job's operation in flight, or starts one. Joining twice is idempotent
  // (returns the same operation). When the last rank joins the phase becomes kPlanning.
  // Errors: a kind/path that does not match the operation in flight, an operation already
  // past gathering, a world size that does not match the job, or (with operation_id) an
  // operation that already ended -- then its own status.
  absl::StatusOr<const Operation*> JoinOperation(JoinRequest request);

  // kPlanning -> kExecuting with one plan part per rank; parts past the world size carry a
  // serving location and add serving participants (ranks without a trainer) to the operation.
  absl::Status SetPlan(absl::string_view operation_id, std::vector<RankPlan> plans);

  // Progress of a rank in kExecuting (bytes done so far, monotone; capped at its total).
  absl::Status ReportProgress(absl::string_view operation_id, int rank, int64_t bytes_done);

  // A rank's final result in kExecuting. A failure aborts the operation naming the rank.
  // When every rank reported success: kCommitting for save/reshard, kDone for load.
  // `written` is kept with the rank's entry (for the committer) when the result is OK.
  // `bytes_read` (load: bytes the rank read from storage) is kept likewise.
  absl::Status ReportResult(absl::string_view operation_id, int rank, const absl::Status& result,
                            std::string written = "", int64_t bytes_read = 0);

  // Ends kCommitting: kDone when `result` is OK, else kAborted with it.
  absl::Status FinishCommit(absl::string_view operation_id, const absl::Status& result);

  // Aborts an operation not yet final and not committing (operator cancel, planner error).
  absl::Status Abort(absl::string_view operation_id, const absl::Status& cause);

  // A worker lost its lease (or died): aborts every operation in gathering, planning or
  // executing that has a rank on it. `cause` says why, e.g. "missed its lease". Returns
  // the ids of the aborted operations.
  std::vector<std::string> WorkerLost(absl::string_view worker_id, absl::string_view cause);

  // Enforces deadlines at the clock's current time. Returns the ids of aborted operations.
  std::vector<std::string> Tick();

  // Lends the bulky per-rank data of an operation (gathered pieces, memory kinds, layouts,
  // mesh shapes, written records) to a planner or committer that runs without the service's
  // lock: returns a copy of the operation holding that data, moved out (O(ranks) moves, no
  // piece copied; the copy has no plan parts). Meanwhile the operation's own entries lack it;
  // nothing reads it before ReturnLent. NotFound for an unknown id.
  absl::StatusOr<Operation> LendGathered(absl::string_view operation_id);
  // A copy of the operation with no ranks (O(1) in the rank count): its id, job, kind, path and
  // options, for work that reads none of the ranks. NotFound for an unknown id.
  absl::StatusOr<Operation> CopyWithoutRanks(absl::string_view operation_id);
  // Moves the data of LendGathered's copy back into the operation (dropped when it was
  // pruned meanwhile).
  void ReturnLent(absl::string_view operation_id, Operation lent);
  // The bulky per-rank data (pieces, records, plan parts) of operations that ended since the
  // last call, which they no longer keep: the caller destroys it, e.g. after releasing its
  // lock (millions of pieces at scale).
  std::vector<std::vector<RankEntry>> TakeReleased();

  // Lookups. Pointers stay valid until the next mutating call. An id of another incarnation
  // is unknown.
  const Operation* FindOperation(absl::string_view operation_id) const;
  const Job* FindJob(absl::string_view job) const;
  const Operation* InFlight(absl::string_view job) const;
  std::vector<const Job*> Jobs() const;
  // Every remembered operation (in flight and recently finished), oldest first.
  std::vector<const Operation*> Operations() const;

  // Incremented by every change of state; lets watchers detect changes cheaply.
  uint64_t version() const { return version_; }
  // Incremented only when some operation changes phase (plans set, aborts, commits): what
  // the work streams wait for, so that joins and progress do not wake every stream.
  uint64_t phase_version() const { return phase_version_; }

 private:
  Operation* MutableOperation(absl::string_view operation_id);
  // The number in an id of this state's form; 0 (never an id) otherwise.
  uint64_t OperationNumber(absl::string_view id) const;
  // NotFound naming the id and this coordinator's incarnation.
  absl::Status UnknownOperation(absl::string_view operation_id) const;
  Operation* CreateOperation(Job& job, OperationKind kind, absl::string_view path,
                             std::string requested_by, absl::Duration arrival_deadline);
  void AbortOperation(Operation& op, absl::Status cause);
  void Finish(Operation& op, Phase final_phase);
  void EnterPhase(Operation& op, Phase phase, absl::Time deadline);
  void PruneFinished(absl::string_view job);
  std::string DescribeRank(const Operation& op, int rank) const;

  const Clock* clock_;
  JobStateOptions options_;
  std::string incarnation_;
  std::map<std::string, Job, std::less<>> jobs_;
  // Every remembered operation by numeric id (creation order).
  std::map<uint64_t, std::unique_ptr<Operation>> operations_;
  std::map<std::string, std::string, std::less<>> in_flight_;  // job -> operation id
  std::vector<std::vector<RankEntry>> released_;               // see TakeReleased
  PieceListInterner piece_lists_;  // the ranks' shared piece lists (RankEntry::shards)
  uint64_t next_operation_ = 1;
  uint64_t version_ = 0;
  uint64_t phase_version_ = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_JOB_STATE_H_
