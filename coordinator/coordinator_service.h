// The gRPC shell of the coordinator (ckpt.pb.Coordinator): worker registration and leases,
// jobs, and save/load/reshard operations, over the pure JobState and WorkerRegistry. A
// background thread ticks leases and deadlines; workers pull their plan parts over the
// WatchWork stream, so the coordinator never dials a worker.
//
// Every method is a gRPC callback method, so the server has no synchronous thread pool (whose
// threads grow with concurrent calls, and which rejects calls once capped). The long-lived
// calls (WatchWork streams, WaitOperation) hold no thread while they wait: they wait in lists
// that every change of state (and the ticker, for deadlines and leases) walks. The short
// calls run on gRPC's callback threads and answer at once. The service's thread count does
// not grow with the number of ranks.
//
// Each operation kind is one OperationKindHandler (plan, commit, finalize) registered with
// RegisterKind: an operation whose kind has none is aborted for every rank with Unimplemented
// naming what is missing.
//
// Access control (docs/services.md, Security): on a TLS server every call is checked against
// the role of the caller's certificate (workers: worker RPCs; operators: operations, status,
// deregistration), and a worker's calls must come from the certificate it registered with.
// Every checkpoint path a caller names is resolved under the checkpoint roots first.
#ifndef CKPT_COORDINATOR_COORDINATOR_SERVICE_H_
#define CKPT_COORDINATOR_COORDINATOR_SERVICE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/arena_messages.h"
#include "common/checkpoint_roots.h"
#include "common/grpc_auth.h"
#include "coordinator/clock.h"
#include "coordinator/description_cache.h"
#include "coordinator/job_state.h"
#include "coordinator/lease_book.h"
#include "coordinator/memory_catalog.h"
#include "coordinator/operation_kind.h"
#include "coordinator/persist_driver.h"
#include "coordinator/piece_classes.h"
#include "coordinator/request_bounds.h"
#include "coordinator/transfer_registry.h"
#include "coordinator/worker_registry.h"
#include "proto/coordinator.grpc.pb.h"
#include "rendezvous/kv_store.h"

namespace ckpt::coordinator {

// Deadlines and timings of the service.
struct CoordinatorOptions {
  absl::Duration lease = absl::Seconds(10);       // a worker missing heartbeats this long is dead
  absl::Duration tick = absl::Milliseconds(100);  // how often leases and deadlines are checked
  JobStateOptions jobs;
  // Where callers may name checkpoints (save, load, reshard source and destination); every
  // path is refused while unset.
  std::optional<CheckpointRoots> checkpoint_roots;
  // This process's incarnation, in every worker and operation id and every response a worker
  // relies on; 0: a random one (what the daemon uses, so a restart gets a new one).
  uint64_t incarnation = 0;
  // Memory for the ranks' kept state descriptions (repeat operations send only digests);
  // 0 keeps none, so every join carries its full description.
  int64_t description_cache_bytes = int64_t{2} << 30;
  // How long a call whose ranks describe their pieces by reference to a layout class that
  // another rank was asked to describe in full waits for it (coordinator/piece_classes.h);
  // past it, its ranks are asked for their full descriptions. Well under the workers' RPC
  // deadline (worker/coordinator_link.h, 5 s), so a parked call is answered before its worker
  // gives up on it.
  absl::Duration piece_list_wait = absl::Seconds(2);
  // A cluster reshard places at most this many of its target ranks on each live worker it
  // uses; a larger target layout is refused before anything is registered.
  int64_t max_reshard_ranks_per_worker = 1024;
  // Quotas per caller identity (issue 39; the certificate's principal on a TLS server, else
  // the peer's address without its port): workers registered (live or dead and not yet
  // forgotten) and jobs with attached ranks that its workers created. ResourceExhausted past
  // them, naming the identity and the limit.
  int64_t max_workers_per_identity = 16384;
  int64_t max_jobs_per_identity = 1024;
  // Dead workers stay listed (status, death causes) this long after their lease expired, and
  // at most max_dead_workers of them (the longest dead are forgotten first).
  absl::Duration dead_worker_retention = absl::Minutes(10);
  int64_t max_dead_workers = 1024;
};

// The service. Thread-safe; construct, wire planners, Start(), register with a grpc server.
class CoordinatorService final : public pb::Coordinator::CallbackService {
 public:
  // The most joins one JoinOperations call may carry (a worker's ranks; bounds one call's work).
  static constexpr int kMaxJoinsPerCall = ::ckpt::coordinator::kMaxJoinsPerCall;
  // The most layout classes held per job for descriptions by reference (piece_classes.h).
  static constexpr int64_t kMaxPieceClassesPerJob = 65536;

  CoordinatorService(const Clock* clock, CoordinatorOptions options);
  ~CoordinatorService() override;

  // Wiring, before Start(). `handler` (not owned) must outlive the service.
  void RegisterKind(OperationKind kind, OperationKindHandler* handler);
  // The rendezvous store whose keys "<kind>/<operation id>/" are erased once the operation
  // ended (its ranks' communicators are gone). Optional; must outlive the service.
  void set_rendezvous_store(KvStore* kv) { rendezvous_ = kv; }
  // The in-memory tier's catalog: mem://<name> paths are accepted (name validated), a worker
  // whose lease is lost loses its copies there, and GetStatus lists it. Optional (without
  // one, mem:// paths are refused); must outlive the service.
  void set_memory_catalog(MemoryCatalog* catalog) { memory_catalog_ = catalog; }
  // The background persistence of memory checkpoints (persist_to): without one, a save asking
  // for it is refused. Optional; must outlive the service (coordinator_persist.cc).
  void set_persist_driver(PersistDriver* driver) { persist_ = driver; }
  // Live transfer's published names and versions: xfer:// paths are accepted (with a memory
  // catalog) and GetStatus lists them. Optional; must outlive the service.
  void set_published_registry(PublishedRegistry* registry) { published_ = registry; }

  // Starts the lease/deadline ticker thread and the advancer thread (planners, committers).
  void Start();
  // Stops the ticker and ends every WatchWork stream (Unavailable) and waiting call (with the
  // operation's current status) at once.
  void Shutdown();

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const pb::RegisterWorkerRequest* request,
                                           pb::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const pb::HeartbeatRequest* request,
                                      pb::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const pb::DeregisterWorkerRequest* request,
                                             pb::DeregisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* AttachRank(grpc::CallbackServerContext* context,
                                       const pb::AttachRankRequest* request,
                                       pb::AttachRankResponse* response) override;
  grpc::ServerUnaryReactor* DetachRank(grpc::CallbackServerContext* context,
                                       const pb::DetachRankRequest* request,
                                       pb::DetachRankResponse* response) override;
  grpc::ServerUnaryReactor* JoinOperation(grpc::CallbackServerContext* context,
                                          const pb::JoinOperationRequest* request,
                                          pb::JoinOperationResponse* response) override;
  // Each join as JoinOperation would handle it alone, in order (at most kMaxJoinsPerCall);
  // answered once every join is (after planning, when one of them completed a gather).
  grpc::ServerUnaryReactor* JoinOperations(grpc::CallbackServerContext* context,
                                           const pb::JoinOperationsRequest* request,
                                           pb::JoinOperationsResponse* response) override;
  // Streams the worker's plan parts and aborts as they appear, until the worker is lost or
  // deregistered, the client cancels, or the coordinator shuts down. One stream per worker:
  // a newer stream for the same worker id replaces the older one, which ends with Aborted.
  grpc::ServerWriteReactor<pb::WorkItem>* WatchWork(grpc::CallbackServerContext* context,
                                                    const pb::WatchWorkRequest* request) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const pb::ReportProgressRequest* request,
                                           pb::ReportProgressResponse* response) override;
  grpc::ServerUnaryReactor* ReportResult(grpc::CallbackServerContext* context,
                                         const pb::ReportResultRequest* request,
                                         pb::ReportResultResponse* response) override;
  // Answers the operation's status once it ended, at the earlier of timeout_ms and the client's
  // deadline, or at shutdown, whichever comes first.
  grpc::ServerUnaryReactor* WaitOperation(grpc::CallbackServerContext* context,
                                          const pb::WaitOperationRequest* request,
                                          pb::OperationStatus* response) override;
  grpc::ServerUnaryReactor* RequestOperation(grpc::CallbackServerContext* context,
                                             const pb::RequestOperationRequest* request,
                                             pb::RequestOperationResponse* response) override;
  grpc::ServerUnaryReactor* PendingOperation(grpc::CallbackServerContext* context,
                                             const pb::PendingOperationRequest* request,
                                             pb::PendingOperationResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const pb::GetStatusRequest* request,
                                      pb::GetStatusResponse* response) override;
  // Starts a reshard executed on the live workers: the target layout's ranks are spread over
  // them round-robin (in registration order), then planned and executed like any operation.
  grpc::ServerUnaryReactor* StartReshard(grpc::CallbackServerContext* context,
                                         const pb::StartReshardRequest* request,
                                         pb::StartReshardResponse* response) override;
  // A worker's report on a PersistWork item (answered at once; storage steps run on the
  // advancer thread).
  grpc::ServerUnaryReactor* ReportPersist(grpc::CallbackServerContext* context,
                                          const pb::PersistReportRequest* request,
                                          pb::PersistReportResponse* response) override;

  // One pass of lease and deadline checks (the ticker calls it; tests may too).
  void TickOnce();
  // Open WatchWork streams and waiting WaitOperation calls (for tests and metrics).
  size_t open_watchers();
  size_t open_waits();
  // JoinOperations calls waiting for a layout class another rank was asked to describe.
  int64_t parked_join_calls() const { return piece_classes_.parked(); }

  // Whether `peer` may use the rendezvous keys of `group` ("<kind>/<operation id>"): the
  // operation is in flight and the peer is a worker serving one of its ranks (any caller on
  // a plaintext server). Returns the operation's job, for messages.
  absl::StatusOr<std::string> AuthorizeRendezvous(const Peer& peer, absl::string_view group);
  // This process's incarnation (never 0) and its 16-digit hex form used in ids.
  uint64_t incarnation() const { return incarnation_; }
  const std::string& incarnation_hex() const { return incarnation_hex_; }

 private:
  // One join of a JoinOperations call answered after its operation advanced.
  struct DeferredJoin {
    std::string operation_id;
    pb::JoinResult* result = nullptr;  // its response's operation is filled; NotFound if pruned
  };
  // A call answered once its operation's planner or committer ran on the advancer thread
  // (not on one of gRPC's callback threads, which heartbeats need meanwhile).
  struct DeferredAnswer {
    std::string operation_id;            // empty: answer at once
    pb::OperationStatus* out = nullptr;  // filled with the operation's state after, if set
    bool pruned_is_not_found = false;    // an operation pruned meanwhile: NotFound
    grpc::ServerUnaryReactor* reactor = nullptr;
    // A JoinOperations call: every deferred join (operation_id is the first one's).
    std::vector<DeferredJoin> joins;
  };
  // Worker id -> its joined ranks, (operation, rank), over every operation.
  using RanksByWorker =
      std::unordered_map<std::string, std::vector<std::pair<const Operation*, int>>>;
  // The joined ranks of every worker (or of worker `only`). Requires mu_.
  RanksByWorker IndexRanks(const std::optional<std::string>& only = std::nullopt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether Advance would run a planner or committer for the operation now.
  bool NeedsAdvancer(const std::string& operation_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `status` now when the call deferred nothing (`later` names no operation);
  // otherwise queues `later` for the advancer thread and returns its reactor.
  // `reactor`: the call's, when it was taken already (a parked JoinOperations call).
  grpc::ServerUnaryReactor* AnswerNowOrAfterAdvance(grpc::CallbackServerContext* context,
                                                    grpc::Status status, DeferredAnswer later,
                                                    grpc::ServerUnaryReactor* reactor = nullptr);
  // Answers `later` with the operation's state. Requires mu_.
  void FinishDeferred(const DeferredAnswer& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The advancer thread's loop: Advance each queued operation, then answer its call.
  void RunAdvancer();

  // The short calls' bodies; each callback method answers with its status at once.
  grpc::Status DoRegisterWorker(const grpc::ServerContextBase* context,
                                const pb::RegisterWorkerRequest* request,
                                pb::RegisterWorkerResponse* response);
  grpc::Status DoHeartbeat(const grpc::ServerContextBase* context,
                           const pb::HeartbeatRequest* request, pb::HeartbeatResponse* response);
  grpc::Status DoDeregisterWorker(const grpc::ServerContextBase* context,
                                  const pb::DeregisterWorkerRequest* request,
                                  pb::DeregisterWorkerResponse* response);
  grpc::Status DoAttachRank(const grpc::ServerContextBase* context,
                            const pb::AttachRankRequest* request, pb::AttachRankResponse* response);
  grpc::Status DoDetachRank(const grpc::ServerContextBase* context,
                            const pb::DetachRankRequest* request, pb::DetachRankResponse* response);
  // What the joins of one JoinOperations call share: the caller (authorized once) and one log
  // line.
  struct JoinBatch {
    Peer peer;
    std::string operation_id, job;
    int joined = 0, by_digest = 0, first_rank = -1, last_rank = -1;
    int joined_ranks = 0, world_size = 0;  // of the operation, after the last join
    pb::JoinResult* result = nullptr;      // the join being handled (its place in the answer)
    // Joins still gathering, answered once the call's joins are all done (AnswerJoinBatch:
    // one Advance and one OperationStatus per operation, not one per join).
    std::vector<DeferredJoin> to_answer;
    // Parked calls the layout classes described in this call completed (run after it).
    std::vector<PieceClasses::Resume> ready;
  };
  // A JoinOperations call's joins, handled (the call is admitted: see piece_classes.h);
  // answers through `reactor` when given (a call that was parked). Returns the call's reactor.
  grpc::ServerUnaryReactor* RunJoinBatch(grpc::CallbackServerContext* context,
                                         const pb::JoinOperationsRequest* request,
                                         pb::JoinOperationsResponse* response, const Peer& peer,
                                         grpc::ServerUnaryReactor* reactor);
  // Whether `request` may be handled now; otherwise it is parked until the layout classes its
  // joins name are held, it is asked for one in place of an overdue supplier, or `latest`
  // passes, and `resume` handles it then.
  bool AdmitJoinBatch(const pb::JoinOperationsRequest& request, absl::Time latest,
                      PieceClasses::Resume resume);
  // Logs a JoinOperations call's joins (ranks_joined): at info when it starts the operation's
  // gather, passes another tenth of its ranks or ends it; else at debug.
  static void LogJoinBatch(const JoinBatch& batch);
  // Runs parked calls handed back (never under mu_).
  void RunResumes(std::vector<PieceClasses::Resume> resumes);
  // Advances each operation of `batch.to_answer` once and fills its joins' answers. Takes the
  // lock.
  void AnswerJoinBatch(const JoinBatch& batch);
  // Fills `join.result` with its operation's state now, or NotFound when it was pruned; true
  // when found. Requires mu_.
  bool AnswerJoin(const DeferredJoin& join);
  // The checkpoint path of `request` resolved (CheckpointPath), or as an earlier join of a
  // gathering operation resolved it (join_paths_).
  absl::StatusOr<std::string> JoinPath(const pb::JoinOperationRequest& request,
                                       OperationKind kind) const;
  // Keeps the path `op` resolved `sent` to for the later joins of its gather (join_paths_):
  // only once a join joined it, so a path no operation took is never kept. Requires mu_.
  void RememberJoinPath(const std::string& sent, const Operation& op) const;
  // Forgets the join paths resolved so far (an operation's gather or the operation ended: the
  // next operation resolves its path afresh, following a symbolic link changed in between).
  void ForgetJoinPaths() const;
  // One join; `batch` is null for a JoinOperation call (which logs each join itself).
  // `ready` receives the parked calls a layout class this join described completed.
  grpc::Status DoJoinOperation(const grpc::ServerContextBase* context,
                               const pb::JoinOperationRequest* request,
                               pb::JoinOperationResponse* response, DeferredAnswer* later,
                               std::vector<PieceClasses::Resume>* ready,
                               JoinBatch* batch = nullptr);
  grpc::Status DoReportProgress(const grpc::ServerContextBase* context,
                                const pb::ReportProgressRequest* request,
                                pb::ReportProgressResponse* response);
  grpc::Status DoReportResult(const grpc::ServerContextBase* context,
                              const pb::ReportResultRequest* request,
                              pb::ReportResultResponse* response, DeferredAnswer* later);
  grpc::Status DoRequestOperation(const grpc::ServerContextBase* context,
                                  const pb::RequestOperationRequest* request,
                                  pb::RequestOperationResponse* response);
  grpc::Status DoPendingOperation(const grpc::ServerContextBase* context,
                                  const pb::PendingOperationRequest* request,
                                  pb::PendingOperationResponse* response);
  grpc::Status DoGetStatus(const grpc::ServerContextBase* context,
                           const pb::GetStatusRequest* request, pb::GetStatusResponse* response);
  grpc::Status DoStartReshard(const grpc::ServerContextBase* context,
                              const pb::StartReshardRequest* request,
                              pb::StartReshardResponse* response, DeferredAnswer* later);

  class WorkWatcher;      // one WatchWork stream (coordinator_reactors.cc)
  class OperationWaiter;  // one WaitOperation call (coordinator_reactors.cc)

  // The ticker's loop: TickOnce every tick, and the waits' deadlines in between.
  void RunTicker();
  // Ends the waits that are over (their operation ended, or `all`: also deadlines and
  // shutdown) and lets the watchers stream what changed (`all`: also re-check their worker).
  void WakeWaiters(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the waits whose deadline has passed (and nothing else: a wait's deadline must not
  // refresh every watcher, which at 20k ranks woke thousands of streams per wait).
  void ExpireWaits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status of final operation `op`, as WaitOperation answers it. Requires mu_.
  const pb::OperationStatus& FinalStatus(const Operation& op);
  // The earliest deadline of a waiting WaitOperation (InfiniteFuture when none).
  absl::Time EarliestWaitDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the planner (or aborts) for an operation that just entered planning, and the
  // committer for one that just entered committing. Requires mu_.
  void Advance(const std::string& operation_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advance's planning step for an operation in planning that `kind` plans: sets its plan or
  // aborts it. Releases mu_ while preparing and planning.
  void Plan(const std::string& operation_id, OperationKindHandler& kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogAborted(const std::vector<std::string>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts with `cause` and logs it; logs the refusal if the state machine refused.
  void AbortOrLog(const std::string& operation_id, const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Folds the renewals the lease book recorded into the registry (before leases are read).
  void ApplyRenewals() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records in the lease book how long `request` waited for its handler (its stated timeout
  // against the time left of the call's deadline); nothing when it stated none.
  void NoteHeartbeatLag(const grpc::ServerContextBase& context,
                        const pb::HeartbeatRequest& request);
  // The coordinator's recent heartbeat lag (at most one lease): what leases are extended by.
  absl::Duration HeartbeatLag();
  // The handler registered for op's kind; nullptr when none is.
  OperationKindHandler* KindOf(const Operation& op) const;
  // Once per ended operation: its kind's Finalize, then its rendezvous keys are erased.
  void Finalize(const Operation& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PermissionDenied unless `peer` registered worker `worker_id` (always OK unauthenticated).
  absl::Status ActsForWorker(const Peer& peer, absl::string_view worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // As ActsForWorker, for the worker that rank `rank` of `operation_id` runs on.
  absl::Status ActsForRank(const Peer& peer, const std::string& operation_id, int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refused request (a bound, a quota): `s` with the caller named, logged (its message holds
  // at most a bounded prefix of any value the caller sent).
  static grpc::Status Refuse(const absl::Status& s, const Peer& peer);
  // Who the quotas count `peer` as: its certificate's principal, else its address without the
  // port.
  static std::string IdentityOf(const Peer& peer);
  // ResourceExhausted when `identity` holds max_workers_per_identity workers already and
  // `description` is not one of them registering again.
  absl::Status MayAddWorker(const std::string& identity, const WorkerDescription& description)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the identities' entries of workers the registry forgot (dead long enough).
  void ForgetForgottenWorkers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResourceExhausted (refused, see Refuse) when job `job` does not exist (or has no ranks)
  // and `peer`'s identity created max_jobs_per_identity jobs that still have ranks; otherwise
  // records the identity as the creator of a job it creates now.
  grpc::Status MayCreateJob(const Peer& peer, const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PermissionDenied when `peer` may not register `description` (another certificate's worker).
  absl::Status MayRegister(const Peer& peer, const WorkerDescription& description) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cluster reshard's `world_size` ranks spread round-robin over the live workers (the first
  // `max_workers` registered; 0: all), at most options_.max_reshard_ranks_per_worker each.
  absl::StatusOr<std::vector<RankLocation>> PlaceReshardRanks(int64_t world_size, int max_workers,
                                                              size_t* workers_used) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `path` resolved under the checkpoint roots (see CheckpointRoots::Resolve).
  absl::StatusOr<std::string> CheckpointPath(absl::string_view path, absl::string_view what) const;
  // The state description a join stands for: the request's own with its compact tensors
  // expanded (into `*expanded` when it has any), or (when it sent only a digest) the kept one,
  // held alive by `*kept`. Null when the digest does not match what the coordinator keeps:
  // `response` then tells the rank to send its full description. A join carrying a full
  // description and a digest has its expansion kept, under the digest of what it sent (computed
  // here). InvalidArgument naming job, rank and tensor for a compact tensor that cannot expand.
  // `*digest`: the coordinator's digest of the description ("" when the rank sent none).
  // `*pieces`: its shards as layout classes when the description cache split them (a kept
  // description then comes back without its shards); null otherwise. A full description
  // without compact tensors makes its layout class held (`*ready`: the parked calls that
  // completes); a description by reference (piece_list) is rebuilt from its held class into
  // `*expanded` and `*pieces`, or answered send_full_state when the class is not held.
  absl::StatusOr<const pb::RankState*> JoinState(const pb::JoinOperationRequest& request,
                                                 pb::JoinOperationResponse* response,
                                                 std::shared_ptr<const pb::RankState>* kept,
                                                 std::string* digest,
                                                 std::shared_ptr<const RankPieces>* pieces,
                                                 pb::RankState* expanded,
                                                 std::vector<PieceClasses::Resume>* ready);
  // JoinState for a description by reference to a layout class.
  absl::StatusOr<const pb::RankState*> JoinStateByReference(
      const pb::JoinOperationRequest& request, pb::JoinOperationResponse* response,
      std::string* digest, std::shared_ptr<const RankPieces>* pieces, pb::RankState* expanded);
  // The memory tier loses `worker_id`'s copies (its lease was lost or it deregistered).
  void DropMemoryCopies(const std::string& worker_id, const std::string& host);

  // Background persistence (coordinator_persist.cc).
  // The storage path `persist_to` of a join or request resolved ("" when none), after checking
  // it may be asked for: InvalidArgument naming it for a mem:// path or an operation that is
  // not a memory save; FailedPrecondition without a persist driver.
  absl::StatusOr<std::string> PersistTarget(OperationKind kind, const std::string& path,
                                            const std::string& persist_to,
                                            absl::string_view what) const;
  // A join's memory-tier options checked (InvalidArgument naming the rank and the value for
  // negative replicas, or as PersistTarget); returns its resolved persist_to.
  absl::StatusOr<std::string> JoinMemoryOptions(OperationKind kind, const std::string& path,
                                                const pb::JoinOperationRequest& request) const;
  // Queues the persistence of memory save `op` that just committed, if it asked for one.
  void QueuePersist(const Operation& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On the advancer thread: runs the driver's storage steps unlocked, then wakes the streams.
  void RunPersistSteps() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver changed (`changed`): wake the advancer and the work streams.
  void PersistChanged(bool changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker lost or deregistered: its persistence work moves to other holders.
  void PersistWorkerLost(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Memory checkpoints `worker_id` evicted (its heartbeat said so) lose its copies.
  void DropEvictedCopies(const std::string& worker_id, const pb::HeartbeatRequest& request);
  grpc::Status DoReportPersist(const grpc::ServerContextBase* context,
                               const pb::PersistReportRequest* request);
  // Memory catalog recovery (coordinator_recovery.cc): a registering worker's report of its
  // memory tier rebuilds the catalog and the published versions, and restarts persistences
  // that were in flight once every file has a holder again (or the wait for the workers to
  // re-register, two leases after this process started, is over: `even_uncovered`).
  void AdoptMemory(const std::string& worker_id, const std::string& host,
                   const pb::RegisterWorkerRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRecoveredPersists(bool even_uncovered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  CoordinatorOptions options_;
  const uint64_t incarnation_;
  const std::string incarnation_hex_;
  const absl::Time started_;
  std::mutex mu_;
  std::condition_variable_any ticker_wake_;  // shutdown, or a wait with an earlier deadline
  absl::Time ticker_sleeps_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  JobState jobs_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  LeaseBook leases_;  // its own lock: heartbeats of live workers do not take mu_
  bool heartbeats_lagging_ ABSL_GUARDED_BY(mu_) = false;  // lag >= 1 s at the last tick (logged)
  // Each rank's last state description (its own lock): repeat joins send only its digest.
  DescriptionCache descriptions_;
  // The layout classes ranks describe their pieces by, and calls waiting for them.
  PieceClasses piece_classes_;
  std::map<OperationKind, OperationKindHandler*> kinds_;
  KvStore* rendezvous_ = nullptr;
  MemoryCatalog* memory_catalog_ = nullptr;
  PersistDriver* persist_ = nullptr;
  bool persist_due_ ABSL_GUARDED_BY(mu_) = false;  // the driver has storage steps queued
  PublishedRegistry* published_ = nullptr;
  std::set<std::string> finalized_ ABSL_GUARDED_BY(mu_);
  // Each final operation's status, made once (FinalStatus) for its WaitOperation answers and
  // its `ended` work items: building one walks every rank. Forgotten with the operation.
  std::map<std::string, pb::OperationStatus> final_statuses_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Operations whose planner or committer is running (unlocked) right now.
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);
  // Checkpoint paths of gathering operations, as their joins sent them -> resolved, since an
  // operation's gather (or an operation) last ended (JoinPath, RememberJoinPath): every rank of
  // an operation names its path, and resolving it reads each of its components' links (five
  // system calls per join call for /tmp/dir/name). At most kMaxJoinPaths. Its own lock, taken
  // after mu_ or alone: JoinPath runs without mu_.
  static constexpr size_t kMaxJoinPaths = 256;
  mutable std::mutex join_paths_mu_;
  mutable absl::flat_hash_map<std::string, std::string> join_paths_ ABSL_GUARDED_BY(join_paths_mu_);
  // Worker id -> the principal (Peer::Principal) of the certificate that registered it.
  std::map<std::string, std::string> worker_owners_ ABSL_GUARDED_BY(mu_);
  // Worker id -> the identity (IdentityOf) that registered it, and each identity's count of
  // them (forgotten workers leave both when an identity reaches its quota).
  std::map<std::string, std::string> worker_identities_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> workers_per_identity_ ABSL_GUARDED_BY(mu_);
  // Job name -> the identity whose worker's rank created it (while it has ranks).
  std::map<std::string, std::string> job_creators_ ABSL_GUARDED_BY(mu_);
  // Worker id -> its one open WatchWork stream.
  std::map<std::string, WorkWatcher*> stream_of_worker_ ABSL_GUARDED_BY(mu_);
  std::set<WorkWatcher*> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t watchers_version_ ABSL_GUARDED_BY(mu_) = 0;  // phase_version they last saw
  // Ticks since the ticker last had every watcher re-check its worker (TickOnce).
  static constexpr int kTicksPerWatcherSweep = 10;
  int ticks_since_watcher_sweep_ ABSL_GUARDED_BY(mu_) = 0;
  // Operation id -> its waiting WaitOperation calls.
  std::multimap<std::string, OperationWaiter*> waiters_ ABSL_GUARDED_BY(mu_);
  // The same waits by deadline: the ticker finds the earliest and the expired ones without
  // walking every wait (at 10k waiting ranks, each wait's deadline woke a walk of all of them).
  std::multimap<absl::Time, OperationWaiter*> wait_deadlines_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;
  // The joins' messages on one arena per call (a description is thousands of small messages).
  ArenaMessageAllocator<pb::JoinOperationRequest, pb::JoinOperationResponse> join_messages_;
  ArenaMessageAllocator<pb::JoinOperationsRequest, pb::JoinOperationsResponse> joins_messages_;
  std::deque<DeferredAnswer> advance_queue_ ABSL_GUARDED_BY(mu_);
  std::condition_variable_any advance_wake_;
  std::thread advancer_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_SERVICE_H_
