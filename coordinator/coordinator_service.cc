#include "coordinator/coordinator_service.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/memory_path.h"
#include "common/status_macros.h"
#include "common/transfer_path.h"
#include "coordinator/group_plan.h"
#include "coordinator/operation_wire.h"
#include "coordinator/transfer_kinds.h"
#include "planner/layout_spec.h"
#include "planner/rank_description.h"
#include "proto/compact_convert.h"
#include "proto/deterministic.h"
#include "proto/state_digest.h"
#include "proto/status_detail.h"
#include "spdlog/spdlog.h"
#include "storage/piece_codec.h"

namespace ckpt::coordinator {
namespace {

uint64_t ChooseIncarnation(uint64_t requested) {
  std::random_device random;
  while (requested == 0) {
    requested = (static_cast<uint64_t>(random()) << 32) ^ random();
  }
  return requested;
}

// Answers a short call at once with `status`.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

CoordinatorService::CoordinatorService(const Clock* clock, CoordinatorOptions options)
    : clock_(clock),
      options_(options),
      incarnation_(ChooseIncarnation(options.incarnation)),
      incarnation_hex_(absl::StrFormat("%016x", incarnation_)),
      started_(clock->Now()),
      jobs_(clock, options.jobs, incarnation_hex_),
      workers_(clock, options.lease, options.dead_worker_retention, incarnation_hex_,
               options.max_dead_workers),
      descriptions_(options.description_cache_bytes),
      piece_classes_(options.piece_list_wait, kMaxPieceClassesPerJob) {
  SetMessageAllocatorFor_JoinOperation(&join_messages_);
  SetMessageAllocatorFor_JoinOperations(&joins_messages_);
}

CoordinatorService::~CoordinatorService() { Shutdown(); }

void CoordinatorService::RegisterKind(OperationKind kind, OperationKindHandler* handler) {
  kinds_[kind] = handler;
}

OperationKindHandler* CoordinatorService::KindOf(const Operation& op) const {
  auto it = kinds_.find(op.kind);
  return it == kinds_.end() ? nullptr : it->second;
}

void CoordinatorService::Finalize(const Operation& op) {
  ForgetJoinPaths();  // an operation that ended while gathering: the next one resolves afresh
  if (OperationKindHandler* kind = KindOf(op); kind != nullptr) {
    if (absl::Status s = kind->Finalize(op); !s.ok()) {
      spdlog::error("operation_finalize_failed op={} error=\"{}\"", op.id,
                    std::string(s.message()));
    }
  }
  if (rendezvous_ != nullptr) {
    // Whatever the operation's ranks left in the rendezvous store goes with it.
    const size_t erased =
        rendezvous_->ErasePrefix(absl::StrCat(OperationKindName(op.kind), "/", op.id, "/"));
    if (erased > 0) spdlog::debug("rendezvous_erased op={} keys={}", op.id, erased);
  }
}

void CoordinatorService::Start() {
  ticker_ = std::thread([this] { RunTicker(); });
  advancer_ = std::thread([this] { RunAdvancer(); });
}

void CoordinatorService::RunTicker() {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time next_tick = absl::Now() + options_.tick;
  while (!shutting_down_) {
    // Sleep until the next tick, or the first wait's deadline when that comes sooner.
    const absl::Duration until_deadline = EarliestWaitDeadline() - clock_->Now();
    const absl::Duration sleep =
        std::max(absl::ZeroDuration(), std::min(next_tick - absl::Now(), until_deadline));
    ticker_sleeps_until_ = clock_->Now() + sleep;
    ticker_wake_.wait_for(lock, absl::ToChronoNanoseconds(sleep));
    ticker_sleeps_until_ = absl::InfinitePast();  // awake: registrations need not wake it
    if (shutting_down_) break;
    if (absl::Now() >= next_tick) {
      lock.unlock();
      TickOnce();
      lock.lock();
      next_tick = absl::Now() + options_.tick;
    } else {
      ExpireWaits();  // a wait's deadline
    }
  }
}

bool CoordinatorService::NeedsAdvancer(const std::string& operation_id) const {
  const Operation* op = jobs_.FindOperation(operation_id);
  return op != nullptr && (op->phase == Phase::kPlanning || op->phase == Phase::kCommitting);
}

grpc::ServerUnaryReactor* CoordinatorService::AnswerNowOrAfterAdvance(
    grpc::CallbackServerContext* context, grpc::Status status, DeferredAnswer later,
    grpc::ServerUnaryReactor* reactor_taken) {
  if (later.operation_id.empty() && reactor_taken != nullptr) {
    reactor_taken->Finish(std::move(status));
    return reactor_taken;
  }
  if (later.operation_id.empty()) return Answer(context, std::move(status));
  later.reactor = reactor_taken != nullptr ? reactor_taken : context->DefaultReactor();
  grpc::ServerUnaryReactor* reactor = later.reactor;
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) {
    FinishDeferred(later);
  } else {
    advance_queue_.push_back(std::move(later));
    advance_wake_.notify_all();
  }
  return reactor;
}

bool CoordinatorService::AnswerJoin(const DeferredJoin& join) {
  const Operation* after = jobs_.FindOperation(join.operation_id);
  if (after == nullptr) {
    join.result->clear_response();
    *join.result->mutable_status() = ToDetail(absl::NotFoundError(
        absl::StrCat("operation ", join.operation_id, " ended and was pruned")));
    return false;
  }
  ToProto(*after, join.result->mutable_response()->mutable_operation());
  return true;
}

void CoordinatorService::FinishDeferred(const DeferredAnswer& later) {
  for (const DeferredJoin& join : later.joins) AnswerJoin(join);
  if (!later.joins.empty()) {
    later.reactor->Finish(grpc::Status::OK);
    return;
  }
  const Operation* after = jobs_.FindOperation(later.operation_id);
  if (after == nullptr && later.pruned_is_not_found) {
    later.reactor->Finish(ToGrpcStatus(absl::NotFoundError(
        absl::StrCat("operation ", later.operation_id, " ended and was pruned"))));
    return;
  }
  if (after != nullptr && later.out != nullptr) ToProto(*after, later.out);
  later.reactor->Finish(grpc::Status::OK);
}

namespace {

// The calling thread's CPU time so far.
absl::Duration ThreadCpuTime() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return absl::DurationFromTimespec(t);
}

// Runs `work` (a planner or committer, called without the service's lock) on a short-lived
// thread at nice 10 and returns its result. They are CPU-bound for seconds at scale, while the
// callback threads that answer heartbeats need little CPU but need it within the lease; on
// Linux a thread's nice value is its own. Only this thread yields: the advancer, which takes
// the service's lock around the work, keeps its priority (when it ran at nice 10 itself, a
// 20k-rank save on a loaded machine held the lock for 10 s while storing the plan, and every
// worker lost its lease). Runs `work` inline if no thread can be started.
template <typename Work>
auto RunYielding(Work work) -> decltype(work()) {
  std::optional<decltype(work())> result;
  try {
    std::thread yielding([&] {
      (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
      result.emplace(work());
    });
    yielding.join();
  } catch (const std::system_error&) {
    if (!result.has_value()) result.emplace(work());
  }
  return *std::move(result);
}

// A planner's result, its wall time and its thread's own CPU time (less than the wall when
// it yielded to the callback threads).
struct PlannerRun {
  absl::StatusOr<std::vector<RankPlan>> plans;
  absl::Duration wall, cpu;
};

// Plans `op` with `kind` on a yielding thread (RunYielding), timed.
PlannerRun RunPlanner(OperationKindHandler& kind, const Operation& op) {
  const absl::Time start = absl::Now();
  absl::Duration cpu;
  absl::StatusOr<std::vector<RankPlan>> plans = RunYielding([&] {
    const absl::Duration cpu_start = ThreadCpuTime();
    absl::StatusOr<std::vector<RankPlan>> planned = kind.Plan(op);
    cpu = ThreadCpuTime() - cpu_start;
    return planned;
  });
  return PlannerRun{std::move(plans), absl::Now() - start, cpu};
}

}  // namespace

void CoordinatorService::RunAdvancer() {
  // This thread keeps the default priority: it holds the service's lock between planning and
  // committing (storing plans, building work items), and a lock held by a starved thread
  // starves everyone (RunYielding below).
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    advance_wake_.wait(
        lock, [this] { return shutting_down_ || !advance_queue_.empty() || persist_due_; });
    if (persist_due_ && !shutting_down_) {
      RunPersistSteps();  // unlocks while touching storage
      continue;
    }
    if (advance_queue_.empty()) return;  // shutting down with nothing left
    DeferredAnswer later = std::move(advance_queue_.front());
    advance_queue_.pop_front();
    if (!shutting_down_) Advance(later.operation_id);  // unlocks while planning or committing
    for (const DeferredJoin& join : later.joins) {
      if (!shutting_down_ && join.operation_id != later.operation_id) Advance(join.operation_id);
    }
    FinishDeferred(later);
  }
}

void CoordinatorService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    ticker_wake_.notify_all();
    advance_wake_.notify_all();  // the advancer answers what is queued and stops
    WakeWaiters(/*all=*/true);   // every stream and wait finishes now
  }
  RunResumes(piece_classes_.TakeAllParked());  // answered now (shutting down)
  if (ticker_.joinable()) ticker_.join();
  if (advancer_.joinable()) advancer_.join();
  RunResumes(piece_classes_.TakeAllParked());  // any parked while the first ones ran
}

void CoordinatorService::Changed() {
  std::set<std::string> present;
  for (const Operation* op : jobs_.Operations()) {
    present.insert(op->id);
    if (IsFinal(op->phase) && finalized_.insert(op->id).second) Finalize(*op);
  }
  // Forget operations the state machine no longer remembers.
  for (auto it = finalized_.begin(); it != finalized_.end();) {
    it = present.count(*it) ? std::next(it) : finalized_.erase(it);
  }
  for (auto it = final_statuses_.begin(); it != final_statuses_.end();) {
    it = present.count(it->first) ? std::next(it) : final_statuses_.erase(it);
  }
  WakeWaiters(/*all=*/false);
}

const pb::OperationStatus& CoordinatorService::FinalStatus(const Operation& op) {
  auto [it, added] = final_statuses_.try_emplace(op.id);
  if (added) ToProto(op, &it->second);
  return it->second;
}

absl::Status CoordinatorService::ActsForWorker(const Peer& peer,
                                               absl::string_view worker_id) const {
  if (!peer.authenticated) return absl::OkStatus();
  auto owner = worker_owners_.find(std::string(worker_id));
  // An unknown worker: the call's own checks answer (NotFound, not registered).
  if (owner == worker_owners_.end() || owner->second == peer.Principal()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(peer.Describe(), " may not act for worker ", worker_id,
                   ", which registered with the certificate ", owner->second));
}

absl::Status CoordinatorService::ActsForRank(const Peer& peer, const std::string& operation_id,
                                             int rank) const {
  const Operation* op = jobs_.FindOperation(operation_id);
  if (op == nullptr || rank < 0 || rank >= static_cast<int>(op->ranks.size())) {
    return absl::OkStatus();  // the state machine names what is wrong
  }
  return ActsForWorker(peer, op->ranks[rank].location.worker_id);
}

absl::Status CoordinatorService::MayRegister(const Peer& peer,
                                             const WorkerDescription& description) const {
  if (!peer.authenticated) return absl::OkStatus();
  for (const WorkerRecord* w : workers_.All()) {
    if (w->description.host != description.host || w->description.pid != description.pid) {
      continue;
    }
    if (absl::Status s = ActsForWorker(peer, w->id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

grpc::Status CoordinatorService::Refuse(const absl::Status& s, const Peer& peer) {
  const absl::Status named(s.code(), absl::StrCat(s.message(), " (caller: ", peer.Describe(), ")"));
  // The first 100, then every 1000th: a caller sending nothing but refused requests cannot
  // flood the log either.
  static std::atomic<int64_t> refused{0};
  const int64_t n = ++refused;
  if (n <= 100 || n % 1000 == 0) {
    spdlog::warn("request_refused n={} code={} message=\"{}\"", n,
                 absl::StatusCodeToString(named.code()), std::string(named.message()));
  }
  return ToGrpcStatus(named);
}

std::string CoordinatorService::IdentityOf(const Peer& peer) {
  if (peer.authenticated) return peer.Principal();
  absl::string_view address = peer.address;
  const size_t colon = address.rfind(':');
  if (colon != absl::string_view::npos && colon + 1 < address.size() &&
      address.find_first_not_of("0123456789", colon + 1) == absl::string_view::npos) {
    address = address.substr(0, colon);  // the port: a caller's connections share the rest
  }
  return std::string(address);
}

void CoordinatorService::ForgetForgottenWorkers() {
  for (auto it = worker_identities_.begin(); it != worker_identities_.end();) {
    if (workers_.Find(it->first) != nullptr) {
      ++it;
      continue;
    }
    auto count = workers_per_identity_.find(it->second);
    if (--count->second <= 0) workers_per_identity_.erase(count);
    it = worker_identities_.erase(it);
  }
}

absl::Status CoordinatorService::MayAddWorker(const std::string& identity,
                                              const WorkerDescription& description) {
  // The registry forgets dead workers on its own: their entries go once they could be half.
  if (worker_identities_.size() > 2 * workers_.Size() + 1024) ForgetForgottenWorkers();
  auto held = workers_per_identity_.find(identity);
  if (held == workers_per_identity_.end() || held->second < options_.max_workers_per_identity) {
    return absl::OkStatus();
  }
  if (workers_.FindRegistered(description) != nullptr) return absl::OkStatus();  // again
  ForgetForgottenWorkers();
  held = workers_per_identity_.find(identity);
  if (held == workers_per_identity_.end() || held->second < options_.max_workers_per_identity) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "RegisterWorker: ", identity, " holds ", held->second,
      " registered workers, the most one caller may (--max_workers_per_identity=",
      options_.max_workers_per_identity, "); dead ones are forgotten ",
      absl::FormatDuration(options_.dead_worker_retention), " after their lease expired"));
}

grpc::Status CoordinatorService::MayCreateJob(const Peer& peer, const std::string& job) {
  const Job* existing = jobs_.FindJob(job);
  if (existing != nullptr && !existing->ranks.empty()) return grpc::Status::OK;
  const std::string identity = IdentityOf(peer);
  int64_t held = 0;
  for (auto it = job_creators_.begin(); it != job_creators_.end();) {
    const Job* j = jobs_.FindJob(it->first);
    if (j == nullptr || j->ranks.empty()) {  // ended: it no longer counts
      it = job_creators_.erase(it);
      continue;
    }
    held += it->second == identity ? 1 : 0;
    ++it;
  }
  if (held >= options_.max_jobs_per_identity) {
    return Refuse(absl::ResourceExhaustedError(absl::StrCat(
                      "job ", LogPrefix(job), ": ", identity, " created ", held,
                      " jobs that have ranks, the most one caller may (--max_jobs_per_identity=",
                      options_.max_jobs_per_identity, ")")),
                  peer);
  }
  job_creators_[job] = identity;
  return grpc::Status::OK;
}

absl::StatusOr<std::string> CoordinatorService::CheckpointPath(absl::string_view path,
                                                               absl::string_view what) const {
  if (IsTransferPath(path)) {
    if (memory_catalog_ == nullptr || published_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " '", path, "' refused: this coordinator has no live transfer"));
    }
    absl::StatusOr<TransferPath> parsed = ParseTransferPath(path);
    if (!parsed.ok()) return parsed.status();
    return std::string(path);
  }
  if (IsMemoryPath(path)) {
    if (memory_catalog_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " '", path, "' refused: this coordinator has no memory tier"));
    }
    absl::StatusOr<std::string> name = MemoryCheckpointName(path);
    if (!name.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name.status().message()));
    }
    return absl::StrCat(kMemoryPathPrefix, *name);
  }
  if (!options_.checkpoint_roots.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path,
                     "' refused: this coordinator has no checkpoint root (--checkpoint_root)"));
  }
  return options_.checkpoint_roots->Resolve(path, what);
}

absl::StatusOr<std::string> CoordinatorService::AuthorizeRendezvous(const Peer& peer,
                                                                    absl::string_view group) {
  std::pair<std::string, std::string> parts = absl::StrSplit(group, absl::MaxSplits('/', 1));
  std::lock_guard<std::mutex> lock(mu_);
  const Operation* op = jobs_.FindOperation(parts.second);
  if (op == nullptr || OperationKindName(op->kind) != parts.first) {
    return absl::NotFoundError(
        absl::StrCat("rendezvous group '", group, "' names no operation of this coordinator"));
  }
  if (IsFinal(op->phase)) {
    return absl::FailedPreconditionError(absl::StrCat("operation ", op->id, " of job ", op->job,
                                                      " has ended; its rendezvous is closed"));
  }
  if (!peer.authenticated) return op->job;
  for (const RankEntry& rank : op->ranks) {
    auto owner = worker_owners_.find(rank.location.worker_id);
    if (owner != worker_owners_.end() && owner->second == peer.Principal()) return op->job;
  }
  return absl::PermissionDeniedError(absl::StrCat(peer.Describe(), " serves no rank of operation ",
                                                  op->id, " (job ", op->job,
                                                  ") and may not use its rendezvous"));
}

void CoordinatorService::ApplyRenewals() {
  for (const std::string& id : leases_.TakeRenewals()) (void)workers_.Heartbeat(id);
}

void CoordinatorService::NoteHeartbeatLag(const grpc::ServerContextBase& context,
                                          const pb::HeartbeatRequest& request) {
  if (request.timeout_ms() <= 0) return;
  // The server fixed the call's deadline when it received it (the timeout the worker sent,
  // from then): what is gone of the timeout now is how long the call waited for its handler.
  const absl::Duration timeout = absl::Milliseconds(request.timeout_ms());
  const absl::Duration left = absl::FromChrono(context.deadline()) - absl::Now();
  const absl::Duration lag = std::clamp(timeout - left, absl::ZeroDuration(), timeout);
  leases_.NoteLag(lag, clock_->Now(), options_.lease);
}

absl::Duration CoordinatorService::HeartbeatLag() {
  return leases_.RecentLag(clock_->Now(), options_.lease, options_.lease);
}

void CoordinatorService::TickOnce() {
  // Calls parked for a layout class whose supplier did not come in time: answered now (their
  // ranks are asked for their full descriptions).
  RunResumes(piece_classes_.Expire(clock_->Now()));
  // What operations that ended no longer keep is destroyed at the end, without the lock.
  std::vector<std::vector<RankEntry>> released;
  const absl::Duration lag = HeartbeatLag();
  std::lock_guard<std::mutex> lock(mu_);
  ApplyRenewals();
  if ((lag >= absl::Seconds(1)) != heartbeats_lagging_) {
    heartbeats_lagging_ = !heartbeats_lagging_;
    spdlog::warn("heartbeat_lag lag_ms={} lagging={} (leases are extended by the lag)",
                 absl::ToInt64Milliseconds(lag), heartbeats_lagging_);
  }
  const std::vector<WorkerRecord> lost = workers_.Tick(lag);
  for (const WorkerRecord& dead : lost) {
    leases_.Remove(dead.id);
    spdlog::warn("worker_lost worker={} host={} pid={} cause=\"{}\"", dead.id,
                 dead.description.host, dead.description.pid, dead.death_cause);
    LogAborted(jobs_.WorkerLost(dead.id, dead.death_cause));
    DropMemoryCopies(dead.id, dead.description.host);
    PersistWorkerLost(dead.id, dead.death_cause);
  }
  LogAborted(jobs_.Tick());
  StartRecoveredPersists(clock_->Now() >= started_ + 2 * options_.lease);
  Changed();
  // Every watcher re-checks its worker when one was lost, and otherwise once in
  // kTicksPerWatcherSweep ticks (a safety net: what else a watcher streams wakes it when it
  // changes); each tick refreshing every stream under the lock cost O(workers) ten times a
  // second (issue 16: 12,800 streams at 102,400 ranks).
  if (!lost.empty() || ++ticks_since_watcher_sweep_ >= kTicksPerWatcherSweep) {
    ticks_since_watcher_sweep_ = 0;
    WakeWaiters(/*all=*/true);
  } else {
    ExpireWaits();  // deadlines
  }
  released = jobs_.TakeReleased();
}

void CoordinatorService::DropMemoryCopies(const std::string& worker_id, const std::string& host) {
  if (memory_catalog_ == nullptr) return;
  for (const std::string& name : memory_catalog_->DropWorker(worker_id)) {
    spdlog::warn("memory_copies_lost checkpoint=mem://{} worker={} host={}", name, worker_id, host);
  }
}

void CoordinatorService::AbortOrLog(const std::string& operation_id, const absl::Status& cause) {
  if (absl::Status s = jobs_.Abort(operation_id, cause); !s.ok()) {
    spdlog::error("abort_refused op={} cause=\"{}\" error=\"{}\"", operation_id,
                  std::string(cause.message()), std::string(s.message()));
    return;
  }
  LogAborted({operation_id});
}

void CoordinatorService::LogAborted(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    const Operation* op = jobs_.FindOperation(id);
    if (op != nullptr) {
      spdlog::error("operation_aborted op={} job={} kind={} path={} code={} cause=\"{}\"", op->id,
                    op->job, std::string(OperationKindName(op->kind)), op->path,
                    absl::StatusCodeToString(op->status.code()), std::string(op->status.message()));
    }
  }
}

void CoordinatorService::Plan(const std::string& operation_id, OperationKindHandler& kind) {
  // What touches storage first (a save's staging directory), outside the lock; then a kept
  // plan, if the layout is unchanged, under it (no lend of the gathered data: at 100k ranks the
  // lend and its return cost a repeat save more than finding the kept plan); else the planner
  // outside the lock, on the gathered data lent (moved, not copied: O(ranks) moves).
  // Meanwhile the operation stays in planning: only deadlines and lost workers can end it.
  const Operation header = *jobs_.CopyWithoutRanks(operation_id);
  const absl::Time start = absl::Now();
  const absl::Duration cpu_start = ThreadCpuTime();
  mu_.unlock();
  const absl::Status prepared = kind.Prepare(header);
  mu_.lock();
  auto ended = [&] {
    const Operation* op = jobs_.FindOperation(operation_id);
    if (op != nullptr && op->phase == Phase::kPlanning) return false;
    // It ended meanwhile, and its Finalize may have run before Prepare made anything (a
    // staging directory): finalize again, which removes what is left (Finalize is idempotent).
    Operation aborted = header;
    aborted.phase = Phase::kAborted;
    if (absl::Status s = kind.Finalize(aborted); !s.ok()) {
      spdlog::error("operation_finalize_failed op={} error=\"{}\"", operation_id,
                    std::string(s.message()));
    }
    return true;
  };
  if (ended()) return;
  PlannerRun run;
  if (!prepared.ok()) {
    run.plans = prepared;
  } else if (std::optional<std::vector<RankPlan>> kept =
                 kind.ReusedPlan(*jobs_.FindOperation(operation_id))) {
    run.plans = *std::move(kept);
  } else {
    Operation snapshot = *jobs_.LendGathered(operation_id);
    mu_.unlock();
    run = RunPlanner(kind, snapshot);
    mu_.lock();
    jobs_.ReturnLent(operation_id, std::move(snapshot));
    if (ended()) return;
  }
  run.wall = absl::Now() - start;  // Prepare included
  run.cpu += ThreadCpuTime() - cpu_start;
  absl::StatusOr<std::vector<RankPlan>>& plans = run.plans;
  absl::Status s = plans.ok() ? jobs_.SetPlan(operation_id, *std::move(plans)) : plans.status();
  if (!s.ok()) {
    AbortOrLog(operation_id,
               absl::Status(s.code(), absl::StrCat("planning failed: ", s.message())));
    return;
  }
  const Operation* planned = jobs_.FindOperation(operation_id);
  spdlog::info(
      "operation_planned op={} bytes_total={} plan_reused={} serving_ranks={} "
      "planner_s={:.3f} planner_cpu_s={:.3f}",
      operation_id, planned->BytesTotal(), planned->plan_reused, planned->serving_ranks,
      absl::ToDoubleSeconds(run.wall), absl::ToDoubleSeconds(run.cpu));
}

void CoordinatorService::Advance(const std::string& operation_id) {
  const Operation* op = jobs_.FindOperation(operation_id);
  if (op == nullptr) return;
  if (op->phase == Phase::kPlanning && busy_.insert(operation_id).second) {
    spdlog::info("operation_gathered op={} job={} kind={} path={} ranks={} by_digest={}", op->id,
                 op->job, std::string(OperationKindName(op->kind)), op->path, op->world_size,
                 op->ranks_described_by_digest);
    ForgetJoinPaths();
    OperationKindHandler* kind = KindOf(*op);
    if (kind == nullptr) {
      absl::Status missing = absl::UnimplementedError(absl::StrCat(
          "this coordinator has no ", OperationKindName(op->kind),
          " planner registered (a daemon built without it); nothing was written or loaded"));
      AbortOrLog(operation_id, missing);
    } else {
      Plan(operation_id, *kind);
    }
    busy_.erase(operation_id);
  }
  op = jobs_.FindOperation(operation_id);
  if (op != nullptr && op->phase == Phase::kCommitting && busy_.insert(operation_id).second) {
    // Committing cannot be aborted by anyone else, so the (fsyncing) committer runs unlocked,
    // on the operation's gathered data lent to it (moved, not copied).
    Operation snapshot = *jobs_.LendGathered(operation_id);
    OperationKindHandler* kind = KindOf(snapshot);
    absl::Status committed = absl::UnimplementedError(
        absl::StrCat("this coordinator has no ", OperationKindName(snapshot.kind),
                     " kind registered to commit it; the checkpoint was not committed"));
    if (kind != nullptr) {
      mu_.unlock();
      committed = RunYielding([&] { return kind->Commit(snapshot); });
      mu_.lock();
    }
    const std::string committed_path = snapshot.path;
    if (committed.ok()) QueuePersist(snapshot);  // a memory save with persist_to
    jobs_.ReturnLent(operation_id, std::move(snapshot));
    // Nothing else ends a committing operation, so this cannot fail; if it ever does, the
    // operation would wait for its deadline with nobody the wiser: say so loudly.
    if (absl::Status finished = jobs_.FinishCommit(operation_id, committed); !finished.ok()) {
      spdlog::critical("commit_unrecorded op={} committed={} error=\"{}\"", operation_id,
                       committed.ok(), std::string(finished.message()));
    }
    busy_.erase(operation_id);
    if (committed.ok()) {
      spdlog::info("operation_committed op={} path={}", operation_id, committed_path);
    } else {
      LogAborted({operation_id});
    }
  }
  op = jobs_.FindOperation(operation_id);
  if (op != nullptr && op->phase == Phase::kDone) {
    spdlog::info("operation_done op={} job={} kind={} path={} bytes={}", op->id, op->job,
                 std::string(OperationKindName(op->kind)), op->path, op->BytesDone());
  }
  Changed();
}

grpc::Status CoordinatorService::DoRegisterWorker(const grpc::ServerContextBase* context,
                                                  const pb::RegisterWorkerRequest* request,
                                                  pb::RegisterWorkerResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "RegisterWorker");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckRegisterWorker(*request); !s.ok()) return Refuse(s, *peer);
  const pb::WorkerInfo& info = request->info();
  WorkerDescription d;
  d.host = info.host();
  d.pid = info.pid();
  d.data_plane_address = info.data_plane_address();
  for (int kind : info.memory_kinds()) {
    d.memory_kinds.push_back(static_cast<pb::MemoryKind>(kind));
  }
  d.local_rank = info.local_rank();
  d.gpu = info.gpu();
  d.nccl = info.nccl() && info.gpu() >= 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = MayRegister(*peer, d); !s.ok()) return ToGrpcStatus(s);
  const std::string identity = IdentityOf(*peer);
  if (absl::Status s = MayAddWorker(identity, d); !s.ok()) return Refuse(s, *peer);
  for (auto it = worker_owners_.begin(); it != worker_owners_.end();) {  // forgotten workers
    it = workers_.Find(it->first) != nullptr ? std::next(it) : worker_owners_.erase(it);
  }
  absl::StatusOr<WorkerRecord> record = workers_.Register(d);
  if (!record.ok()) return ToGrpcStatus(record.status());
  if (worker_identities_.emplace(record->id, identity).second) ++workers_per_identity_[identity];
  if (peer->authenticated) worker_owners_[record->id] = peer->Principal();
  leases_.Add(record->id, peer->authenticated ? peer->Principal() : "");
  spdlog::info("worker_registered worker={} host={} pid={} data_plane={} local_rank={} gpu={}",
               record->id, d.host, d.pid, d.data_plane_address, d.local_rank, d.gpu);
  AdoptMemory(record->id, d.host, *request);
  response->set_worker_id(record->id);
  response->set_lease_ms(absl::ToInt64Milliseconds(workers_.lease()));
  response->set_incarnation(incarnation_);
  Changed();
  // Memory the worker holds may be the record another worker's stream is to be sent.
  if (!request->memory_held().empty()) WakeWaiters(/*all=*/true);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoHeartbeat(const grpc::ServerContextBase* context,
                                             const pb::HeartbeatRequest* request,
                                             pb::HeartbeatResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "Heartbeat");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckHeartbeat(*request); !s.ok()) return Refuse(s, *peer);
  response->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response->set_incarnation(incarnation_);
  // A live worker's renewal is recorded without the service's lock (see LeaseBook); only
  // renewals of live workers count towards the coordinator's heartbeat lag.
  const std::string principal = peer->authenticated ? peer->Principal() : "";
  if (leases_.Renew(request->worker_id(), peer->authenticated ? &principal : nullptr)) {
    NoteHeartbeatLag(*context, *request);
    DropEvictedCopies(request->worker_id(), *request);  // the catalog has its own lock
    return grpc::Status::OK;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ApplyRenewals();
  if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  absl::Status s = workers_.Heartbeat(request->worker_id());
  if (!s.ok()) return ToGrpcStatus(s);
  DropEvictedCopies(request->worker_id(), *request);
  response->set_lease_ms(absl::ToInt64Milliseconds(workers_.lease()));
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoDeregisterWorker(const grpc::ServerContextBase* context,
                                                    const pb::DeregisterWorkerRequest* request,
                                                    pb::DeregisterWorkerResponse*) {
  absl::StatusOr<Peer> peer =
      AuthorizeCall(*context, {Role::kWorker, Role::kOperator}, "DeregisterWorker");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckDeregisterWorker(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  if (peer->role == Role::kWorker) {
    if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  const WorkerRecord* record = workers_.Find(request->worker_id());
  if (record == nullptr) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("worker ", request->worker_id(), " is not registered")));
  }
  std::string description = record->DebugString();
  LogAborted(jobs_.WorkerLost(request->worker_id(), "shut down"));
  DropMemoryCopies(request->worker_id(), record->description.host);
  PersistWorkerLost(request->worker_id(), "shut down");
  (void)workers_.Deregister(request->worker_id());
  leases_.Remove(request->worker_id());
  worker_owners_.erase(request->worker_id());
  if (auto it = worker_identities_.find(request->worker_id()); it != worker_identities_.end()) {
    if (--workers_per_identity_[it->second] <= 0) workers_per_identity_.erase(it->second);
    worker_identities_.erase(it);
  }
  spdlog::info("worker_deregistered {} by=\"{}\"", description, peer->Describe());
  Changed();
  WakeWaiters(/*all=*/true);  // its stream ends now
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoAttachRank(const grpc::ServerContextBase* context,
                                              const pb::AttachRankRequest* request,
                                              pb::AttachRankResponse*) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "AttachRank");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckAttachRank(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  const WorkerRecord* worker = workers_.Find(request->worker_id());
  if (worker == nullptr || !worker->alive) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("rank ", request->rank(), " of job ", request->job(), ": worker ",
                     request->worker_id(), " is not registered (or lost its lease)")));
  }
  if (grpc::Status s = MayCreateJob(*peer, request->job()); !s.ok()) return s;
  RankLocation location{worker->id, worker->description.host, worker->description.pid};
  absl::Status s =
      jobs_.AttachRank(request->job(), request->world_size(), request->rank(), location);
  if (!s.ok()) return ToGrpcStatus(s);
  spdlog::info("rank_attached job={} rank={} world_size={} worker={} host={} trainer_pid={}",
               request->job(), request->rank(), request->world_size(), worker->id,
               worker->description.host, request->trainer_pid());
  Changed();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoDetachRank(const grpc::ServerContextBase* context,
                                              const pb::DetachRankRequest* request,
                                              pb::DetachRankResponse*) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "DetachRank");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckDetachRank(*request); !s.ok()) return Refuse(s, *peer);
  std::vector<PieceClasses::Resume> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    LogAborted(jobs_.DetachRank(request->job(), request->rank(), request->worker_id()));
    const Job* job = jobs_.FindJob(request->job());
    if (job == nullptr || job->ranks.empty()) {  // it ended
      descriptions_.DropJob(request->job());
      parked = piece_classes_.DropJob(request->job());
    }
    spdlog::info("rank_detached job={} rank={} worker={}", request->job(), request->rank(),
                 request->worker_id());
    Changed();
  }
  RunResumes(std::move(parked));  // their joins find no class held: send_full_state
  return grpc::Status::OK;
}

namespace {

// The compression spec of a save (storage/piece_codec.h ParseCompression): InvalidArgument
// for a bad spec or one on another operation, Unimplemented on a memory or transfer path
// (their files are not written by WriteDataFiles).
absl::Status CheckCompression(const std::string& spec, OperationKind kind, const std::string& path,
                              const std::string& who) {
  if (spec.empty()) return absl::OkStatus();
  if (absl::StatusOr<CompressionOptions> parsed = ParseCompression(spec); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", parsed.status().message()));
  }
  if (kind != OperationKind::kSave) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": compression \"", spec,
                                                   "\" is for saves, not a ",
                                                   OperationKindName(kind), " of ", path));
  }
  if (IsMemoryPath(path) || IsTransferPath(path)) {
    return absl::UnimplementedError(
        absl::StrCat(who, ": compression \"", spec, "\" is for storage saves; ", path,
                     " is a memory or transfer path (save it without compression)"));
  }
  return absl::OkStatus();
}

// Overwrite is an option of storage saves (their commit swaps the old checkpoint out,
// storage/checkpoint_writer.h): InvalidArgument on another operation or on a memory or
// transfer path (a memory checkpoint's persistence has persist_overwrite).
absl::Status CheckOverwrite(bool overwrite, OperationKind kind, const std::string& path,
                            const std::string& who) {
  if (!overwrite) return absl::OkStatus();
  if (kind != OperationKind::kSave || IsMemoryPath(path) || IsTransferPath(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": overwrite is for saves to storage, not a ", OperationKindName(kind), " of ", path,
        IsMemoryPath(path) ? " (persist_overwrite is the memory "
                             "save's option for its persist_to)"
                           : ""));
  }
  return absl::OkStatus();
}

// The join's request in the job state's terms (its options checked; `state`: the description
// it stands for, the request's own or the kept one).
absl::StatusOr<JoinRequest> ToJoinRequest(const pb::JoinOperationRequest& request,
                                          OperationKind kind, const std::string& path,
                                          const std::string& persist_to, const pb::RankState& state,
                                          bool described_by_digest, std::string digest,
                                          const RankPieces* pieces) {
  JoinRequest join;
  join.job = request.job();
  join.world_size = request.world_size();
  join.rank = request.rank();
  join.kind = kind;
  join.path = path;
  // Layout classes (planner/rank_pieces.h): the description cache's split, else split here;
  // JobState interns them.
  join.pieces =
      pieces != nullptr
          ? *pieces
          : RankPieces(std::vector<pb::PieceMeta>(state.shards().begin(), state.shards().end()));
  for (int memory_kind : state.memory_kinds()) {
    join.memory_kinds.push_back(static_cast<pb::MemoryKind>(memory_kind));
  }
  join.layouts.assign(state.layouts().begin(), state.layouts().end());
  join.mesh_shape.assign(state.mesh_shape().begin(), state.mesh_shape().end());
  join.described_by_digest = described_by_digest;
  join.description_digest = std::move(digest);
  join.held_plan_part_body = request.held_plan_part_body();
  join.operation_id = request.operation_id();
  join.metadata.insert(request.metadata().begin(), request.metadata().end());
  join.load_algorithm = request.load_algorithm();
  join.load_memory_budget_bytes = request.load_memory_budget_bytes();
  join.memory_replicas = request.has_memory_replicas() ? request.memory_replicas() : -1;
  join.persist_to = persist_to;
  join.persist_overwrite = request.persist_overwrite();
  join.process_groups = request.process_groups();
  join.compression = request.compression();
  join.overwrite = request.overwrite();
  const std::string who = absl::StrCat("job ", request.job(), " rank ", request.rank());
  CKPT_RETURN_IF_ERROR(CheckCompression(join.compression, kind, path, who));
  CKPT_RETURN_IF_ERROR(CheckOverwrite(join.overwrite, kind, path, who));
  if (absl::Status s = CheckProcessGroupSpec(join.process_groups, request.world_size(), who);
      !s.ok()) {
    return s;
  }
  if (request.arrival_deadline_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": negative arrival_deadline_ms ", request.arrival_deadline_ms()));
  }
  join.arrival_deadline = absl::Milliseconds(request.arrival_deadline_ms());
  return join;
}

}  // namespace

absl::StatusOr<std::string> CoordinatorService::JoinPath(const pb::JoinOperationRequest& request,
                                                         OperationKind kind) const {
  {
    std::lock_guard<std::mutex> lock(join_paths_mu_);
    auto it = join_paths_.find(request.path());
    if (it != join_paths_.end()) return it->second;  // by an earlier join of this gather
  }
  return CheckpointPath(request.path(), absl::StrCat(OperationKindName(kind), " path of job ",
                                                     request.job(), " rank ", request.rank()));
}

void CoordinatorService::RememberJoinPath(const std::string& sent, const Operation& op) const {
  if (op.phase != Phase::kGathering) return;  // gathered: forgotten at once (Advance)
  std::lock_guard<std::mutex> lock(join_paths_mu_);
  if (join_paths_.size() >= kMaxJoinPaths) join_paths_.clear();
  join_paths_.emplace(sent, op.path);
}

void CoordinatorService::ForgetJoinPaths() const {
  std::lock_guard<std::mutex> lock(join_paths_mu_);
  join_paths_.clear();
}

grpc::Status CoordinatorService::DoJoinOperation(const grpc::ServerContextBase* context,
                                                 const pb::JoinOperationRequest* request,
                                                 pb::JoinOperationResponse* response,
                                                 DeferredAnswer* later,
                                                 std::vector<PieceClasses::Resume>* ready,
                                                 JoinBatch* batch) {
  absl::StatusOr<Peer> peer =
      batch != nullptr ? batch->peer : AuthorizeCall(*context, {Role::kWorker}, "JoinOperation");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  absl::StatusOr<OperationKind> kind = FromProto(request->kind());
  if (!kind.ok()) return ToGrpcStatus(kind.status());
  absl::StatusOr<std::string> path = JoinPath(*request, *kind);
  if (!path.ok()) return ToGrpcStatus(path.status());
  absl::StatusOr<std::string> persist_to = JoinMemoryOptions(*kind, *path, *request);
  if (!persist_to.ok()) return ToGrpcStatus(persist_to.status());
  std::shared_ptr<const pb::RankState> kept;
  std::string digest;
  std::shared_ptr<const RankPieces> pieces;
  pb::RankState expanded;  // the sent description with its compact tensors expanded (issue 16)
  absl::StatusOr<const pb::RankState*> state =
      JoinState(*request, response, &kept, &digest, &pieces, &expanded, ready);
  if (!state.ok()) return ToGrpcStatus(state.status());
  if (*state == nullptr) return grpc::Status::OK;  // the rank re-sends its full description
  // The request's pieces are converted before the lock is taken: the lock is for the state.
  absl::StatusOr<JoinRequest> converted =
      ToJoinRequest(*request, *kind, *path, *persist_to, **state, kept != nullptr,
                    std::move(digest), pieces.get());
  if (!converted.ok()) return ToGrpcStatus(converted.status());
  JoinRequest join = *std::move(converted);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  const WorkerRecord* worker = workers_.Find(request->worker_id());
  if (worker == nullptr || !worker->alive) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("rank ", request->rank(), " of job ", request->job(), ": worker ",
                     request->worker_id(), " is not registered (or lost its lease)")));
  }
  if (grpc::Status s = MayCreateJob(*peer, request->job()); !s.ok()) return s;
  join.location = RankLocation{worker->id, worker->description.host, worker->description.pid,
                               worker->description.gpu, worker->description.nccl};
  const int shard_count = join.pieces.size();
  const std::string job = join.job;
  const int rank = join.rank;
  absl::StatusOr<const Operation*> op = jobs_.JoinOperation(std::move(join));
  if (!op.ok()) return ToGrpcStatus(op.status());
  RememberJoinPath(request->path(), **op);
  std::string id = (*op)->id;
  if (batch == nullptr) {
    spdlog::info("rank_joined op={} job={} rank={} shards={} joined={}/{} by_digest={}", id, job,
                 rank, shard_count, (*op)->JoinedRanks(), (*op)->world_size, kept != nullptr);
  } else {
    batch->operation_id = id;
    batch->job = job;
    if (batch->first_rank < 0) batch->first_rank = rank;
    batch->last_rank = rank;
    ++batch->joined;
    batch->by_digest += kept != nullptr ? 1 : 0;
    batch->joined_ranks = (*op)->JoinedRanks();
    batch->world_size = (*op)->world_size;
  }
  if (NeedsAdvancer(id)) {
    later->operation_id = id;
    later->out = response->mutable_operation();
    later->pruned_is_not_found = true;
    return grpc::Status::OK;
  }
  if (batch != nullptr) {
    batch->to_answer.push_back({std::move(id), batch->result});
    return grpc::Status::OK;
  }
  Advance(id);
  const Operation* after = jobs_.FindOperation(id);
  if (after == nullptr) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("operation ", id, " ended and was pruned")));
  }
  ToProto(*after, response->mutable_operation());
  return grpc::Status::OK;
}

absl::StatusOr<const pb::RankState*> CoordinatorService::JoinState(
    const pb::JoinOperationRequest& request, pb::JoinOperationResponse* response,
    std::shared_ptr<const pb::RankState>* kept, std::string* digest,
    std::shared_ptr<const RankPieces>* pieces, pb::RankState* expanded,
    std::vector<PieceClasses::Resume>* ready) {
  if (request.has_piece_list()) {
    return JoinStateByReference(request, response, digest, pieces, expanded);
  }
  if (!request.state_omitted()) {
    // Compact tensors are expanded once, here: the description kept is the expanded one (a
    // digest-only join never expands again), its digest the one of what the rank sent.
    absl::StatusOr<const pb::RankState*> full = ExpandCompactTensors(
        request.state(), expanded, absl::StrCat("job ", request.job(), " rank ", request.rank()));
    if (!full.ok()) return full.status();
    if (!request.state_digest().empty()) {
      bool kept_now = false;
      PieceClass layout_class;
      std::string class_digest;
      *digest =
          descriptions_.Keep(request.job(), request.world_size(), request.rank(), **full, &kept_now,
                             pieces, &request.state(), &layout_class, &class_digest);
      response->set_state_kept(kept_now);
      if (layout_class.list != nullptr) {
        std::vector<PieceClasses::Resume> now =
            piece_classes_.Add(request.job(), class_digest, std::move(layout_class));
        for (PieceClasses::Resume& r : now) ready->push_back(std::move(r));
      }
    }
    return *full;
  }
  absl::StatusOr<std::shared_ptr<const pb::RankState>> found = descriptions_.Lookup(
      request.job(), request.world_size(), request.rank(), request.state_digest(), pieces);
  if (!found.ok()) {
    spdlog::info("rank_join_needs_full_state job={} rank={} why=\"{}\"", request.job(),
                 request.rank(), std::string(found.status().message()));
    response->set_send_full_state(true);
    response->set_send_full_state_reason(std::string(found.status().message()));
    return static_cast<const pb::RankState*>(nullptr);
  }
  *kept = *std::move(found);
  *digest = request.state_digest();  // equal to the one computed when the description was kept
  return kept->get();
}

absl::StatusOr<const pb::RankState*> CoordinatorService::JoinStateByReference(
    const pb::JoinOperationRequest& request, pb::JoinOperationResponse* response,
    std::string* digest, std::shared_ptr<const RankPieces>* pieces, pb::RankState* expanded) {
  const std::string who = absl::StrCat("job ", request.job(), " rank ", request.rank());
  const pb::RankState& sent = request.state();
  pb::RankState rank_only;
  rank_only.set_rank(sent.rank());
  if (!request.state_omitted() || sent.ByteSizeLong() != rank_only.ByteSizeLong()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": a join by layout class carries only the rank in its state (no pieces, compact "
        "tensors, layouts, kinds or mesh) and sets state_omitted"));
  }
  const std::string& class_digest = request.piece_list().class_digest();
  std::optional<PieceClass> layout_class = piece_classes_.Find(request.job(), class_digest);
  if (!layout_class.has_value()) {
    response->set_send_full_state(true);
    response->set_send_full_state_reason(
        absl::StrCat("the coordinator does not hold layout class ", ShortDigest(class_digest),
                     " of job ", request.job(), ": send the full description"));
    return static_cast<const pb::RankState*>(nullptr);
  }
  absl::StatusOr<RankPieces> own =
      PiecesOfColumn(layout_class->list, request.piece_list().column());
  if (!own.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": layout class ", ShortDigest(class_digest), ": ", own.status().message()));
  }
  if (!expanded->ParseFromString(*layout_class->rest)) {
    return absl::InternalError(absl::StrCat(who, ": the held layout class no longer parses"));
  }
  expanded->set_rank(sent.rank());
  auto shared = std::make_shared<const RankPieces>(*std::move(own));
  *digest = SplitDescriptionDigest(class_digest, sent.rank(), request.piece_list().column());
  if (!request.state_digest().empty()) {
    response->set_state_kept(descriptions_.KeepReferenced(request.job(), request.world_size(),
                                                          request.rank(), *digest, shared,
                                                          SerializeDeterministically(*expanded)));
  }
  *pieces = std::move(shared);
  return static_cast<const pb::RankState*>(expanded);
}

grpc::Status CoordinatorService::DoReportProgress(const grpc::ServerContextBase* context,
                                                  const pb::ReportProgressRequest* request,
                                                  pb::ReportProgressResponse*) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "ReportProgress");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckReportProgress(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ActsForRank(*peer, request->operation_id(), request->rank()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::Status s =
      jobs_.ReportProgress(request->operation_id(), request->rank(), request->bytes_done());
  Changed();
  return ToGrpcStatus(s);
}

grpc::Status CoordinatorService::DoReportResult(const grpc::ServerContextBase* context,
                                                const pb::ReportResultRequest* request,
                                                pb::ReportResultResponse* response,
                                                DeferredAnswer* later) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "ReportResult");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckReportResult(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ActsForRank(*peer, request->operation_id(), request->rank()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const Operation* before = jobs_.FindOperation(request->operation_id());
  if (before != nullptr && before->phase == Phase::kAborted) {
    // Nothing left to record: acknowledged, so the worker stops re-sending.
    ToProto(*before, response->mutable_operation());
    return grpc::Status::OK;
  }
  absl::Status result = FromDetail(request->result());
  absl::Status s = jobs_.ReportResult(request->operation_id(), request->rank(), result,
                                      request->written(), request->bytes_read());
  if (!s.ok()) return ToGrpcStatus(s);
  const Operation* op = jobs_.FindOperation(request->operation_id());
  if (op != nullptr && op->phase == Phase::kAborted) LogAborted({op->id});
  if (NeedsAdvancer(request->operation_id())) {
    later->operation_id = request->operation_id();
    later->out = response->mutable_operation();
    return grpc::Status::OK;
  }
  Advance(request->operation_id());
  if (const Operation* after = jobs_.FindOperation(request->operation_id()); after != nullptr) {
    ToProto(*after, response->mutable_operation());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoRequestOperation(const grpc::ServerContextBase* context,
                                                    const pb::RequestOperationRequest* request,
                                                    pb::RequestOperationResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kOperator}, "RequestOperation");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckRequestOperation(*request); !s.ok()) return Refuse(s, *peer);
  absl::StatusOr<OperationKind> kind = FromProto(request->kind());
  if (!kind.ok()) return ToGrpcStatus(kind.status());
  absl::StatusOr<std::string> path = CheckpointPath(
      request->path(), absl::StrCat(OperationKindName(*kind), " path of job ", request->job()));
  if (!path.ok()) return ToGrpcStatus(path.status());
  absl::StatusOr<std::string> persist_to = PersistTarget(
      *kind, *path, request->persist_to(), absl::StrCat("request of job ", request->job()));
  if (!persist_to.ok()) return ToGrpcStatus(persist_to.status());
  if (request->has_memory_replicas() &&
      (request->memory_replicas() < 0 || *kind != OperationKind::kSave || !IsMemoryPath(*path))) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "request of job ", request->job(), ": memory_replicas ", request->memory_replicas(),
        " is for memory saves (mem://<name>) and must be >= 0; ", OperationKindName(*kind), " of ",
        *path)));
  }
  if (absl::Status s = CheckCompression(request->compression(), *kind, *path,
                                        absl::StrCat("request of job ", request->job()));
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (absl::Status s = CheckOverwrite(request->overwrite(), *kind, *path,
                                      absl::StrCat("request of job ", request->job()));
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (const Job* job = jobs_.FindJob(request->job()); job != nullptr) {
    absl::Status s = CheckProcessGroupSpec(request->process_groups(), job->world_size,
                                           absl::StrCat("job ", request->job()));
    if (!s.ok()) return ToGrpcStatus(s);
  }
  absl::StatusOr<std::string> id = jobs_.RequestOperation(
      request->job(), *kind, *path, absl::Milliseconds(request->arrival_deadline_ms()),
      request->load_algorithm(), request->load_memory_budget_bytes(), request->process_groups());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (!persist_to->empty()) {
    if (absl::Status s = jobs_.SetPersistTo(*id, *persist_to, request->persist_overwrite());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (request->has_memory_replicas()) {
    if (absl::Status s = jobs_.SetMemoryReplicas(*id, request->memory_replicas()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (!request->compression().empty()) {
    if (absl::Status s = jobs_.SetCompression(*id, request->compression()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (request->overwrite()) {
    if (absl::Status s = jobs_.SetOverwrite(*id); !s.ok()) return ToGrpcStatus(s);
  }
  spdlog::info("operation_requested op={} job={} kind={} path={} by=\"{}\"", *id, request->job(),
               std::string(OperationKindName(*kind)), *path, peer->Describe());
  response->set_operation_id(*id);
  Changed();
  return grpc::Status::OK;
}

absl::StatusOr<std::vector<RankLocation>> CoordinatorService::PlaceReshardRanks(
    int64_t world_size, int max_workers, size_t* workers_used) const {
  std::vector<const WorkerRecord*> live;
  for (const WorkerRecord* w : workers_.All()) {
    if (w->alive) live.push_back(w);
  }
  std::stable_sort(live.begin(), live.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
    return a->registered < b->registered;
  });
  if (max_workers > 0 && static_cast<int>(live.size()) > max_workers) live.resize(max_workers);
  if (live.empty()) {
    return absl::FailedPreconditionError(
        "no live worker is registered with this coordinator to execute the reshard; start "
        "ckpt_worker daemons (or reshard without --coordinator, in this process)");
  }
  if (world_size > static_cast<int64_t>(live.size()) * options_.max_reshard_ranks_per_worker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target layout: ", world_size, " ranks over ", live.size(),
        " live worker(s) is more than the limit of ", options_.max_reshard_ranks_per_worker,
        " ranks per worker (--max_reshard_ranks_per_worker); start more workers or reshard "
        "offline (ckptctl reshard without --coordinator)"));
  }
  std::vector<RankLocation> locations;
  for (int64_t r = 0; r < world_size; ++r) {
    const WorkerRecord* w = live[r % live.size()];
    locations.push_back(RankLocation{w->id, w->description.host, w->description.pid});
  }
  *workers_used = live.size();
  return locations;
}

grpc::Status CoordinatorService::DoStartReshard(const grpc::ServerContextBase* context,
                                                const pb::StartReshardRequest* request,
                                                pb::StartReshardResponse* response,
                                                DeferredAnswer* later) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kOperator}, "StartReshard");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckStartReshard(*request); !s.ok()) return Refuse(s, *peer);
  for (const auto& [what, named] :
       {std::pair<const char*, const std::string*>{"source", &request->source()},
        {"destination", &request->destination()}}) {
    if (IsMemoryPath(*named)) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "reshard ", what, " '", *named,
          "' is a memory checkpoint: a cluster reshard reads and writes storage checkpoints "
          "(load a memory checkpoint into any layout with a load, or persist it first)")));
    }
  }
  absl::StatusOr<std::string> source = CheckpointPath(request->source(), "reshard source");
  if (!source.ok()) return ToGrpcStatus(source.status());
  absl::StatusOr<std::string> destination =
      CheckpointPath(request->destination(), "reshard destination");
  if (!destination.ok()) return ToGrpcStatus(destination.status());
  absl::StatusOr<LayoutSpec> layout = LayoutSpec::Parse(request->layout_json());
  if (!layout.ok()) {
    return ToGrpcStatus(absl::Status(layout.status().code(),
                                     absl::StrCat("target layout: ", layout.status().message())));
  }
  if (request->memory_budget_bytes() < 0 || request->max_workers() < 0) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("memory budget and max workers must not be negative"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t workers_used = 0;
  absl::StatusOr<std::vector<RankLocation>> locations =
      PlaceReshardRanks(layout->world_size(), request->max_workers(), &workers_used);
  if (!locations.ok()) return ToGrpcStatus(locations.status());
  ReshardSpec spec;
  spec.source = *source;
  spec.layout_json = request->layout_json();
  spec.overwrite = request->overwrite();
  spec.memory_budget_bytes = request->memory_budget_bytes();
  absl::StatusOr<std::string> id = jobs_.StartReshard(*destination, std::move(spec), *locations);
  if (!id.ok()) return ToGrpcStatus(id.status());
  const Operation* op = jobs_.FindOperation(*id);
  spdlog::info("reshard_started op={} source={} destination={} ranks={} workers={} by=\"{}\"", *id,
               *source, *destination, layout->world_size(), workers_used, peer->Describe());
  response->set_operation_id(*id);
  response->set_job(op->job);
  response->set_world_size(op->world_size);
  response->set_workers(static_cast<int32_t>(workers_used));
  Changed();
  if (NeedsAdvancer(*id)) {
    later->operation_id = *id;
    return grpc::Status::OK;
  }
  Advance(*id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoPendingOperation(const grpc::ServerContextBase* context,
                                                    const pb::PendingOperationRequest* request,
                                                    pb::PendingOperationResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "PendingOperation");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckPendingOperation(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  const Operation* op = jobs_.PendingForRank(request->job(), request->rank());
  response->set_pending(op != nullptr);
  if (op != nullptr) {
    response->set_operation_id(op->id);
    response->set_kind(ToProto(op->kind));
    response->set_path(op->path);
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* context, const pb::RegisterWorkerRequest* request,
    pb::RegisterWorkerResponse* response) {
  return Answer(context, DoRegisterWorker(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const pb::HeartbeatRequest* request,
                                                        pb::HeartbeatResponse* response) {
  return Answer(context, DoHeartbeat(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::DeregisterWorker(
    grpc::CallbackServerContext* context, const pb::DeregisterWorkerRequest* request,
    pb::DeregisterWorkerResponse* response) {
  return Answer(context, DoDeregisterWorker(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::AttachRank(grpc::CallbackServerContext* context,
                                                         const pb::AttachRankRequest* request,
                                                         pb::AttachRankResponse* response) {
  return Answer(context, DoAttachRank(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::DetachRank(grpc::CallbackServerContext* context,
                                                         const pb::DetachRankRequest* request,
                                                         pb::DetachRankResponse* response) {
  return Answer(context, DoDetachRank(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::JoinOperation(grpc::CallbackServerContext* context,
                                                            const pb::JoinOperationRequest* request,
                                                            pb::JoinOperationResponse* response) {
  // Checked here (a JoinOperations call checks every join before it runs one).
  if (absl::Status s = CheckJoinOperation(*request); !s.ok()) {
    absl::StatusOr<Peer> peer = PeerOf(*context);
    return Answer(context, peer.ok() ? Refuse(s, *peer) : ToGrpcStatus(peer.status()));
  }
  DeferredAnswer later;
  std::vector<PieceClasses::Resume> ready;
  grpc::Status status = DoJoinOperation(context, request, response, &later, &ready);
  grpc::ServerUnaryReactor* reactor =
      AnswerNowOrAfterAdvance(context, std::move(status), std::move(later));
  RunResumes(std::move(ready));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::JoinOperations(
    grpc::CallbackServerContext* context, const pb::JoinOperationsRequest* request,
    pb::JoinOperationsResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "JoinOperations");
  if (!peer.ok()) return Answer(context, ToGrpcStatus(peer.status()));
  if (absl::Status s = CheckJoinOperations(*request); !s.ok()) {
    return Answer(context, Refuse(s, *peer));
  }
  for (int i = 0; i < request->joins_size(); ++i) {  // before a class digest is kept
    if (absl::Status s = CheckJoinOperation(request->joins(i)); !s.ok()) {
      return Answer(context, Refuse(absl::InvalidArgumentError(absl::StrCat("JoinOperations joins[",
                                                                            i, "]: ", s.message())),
                                    *peer));
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Parked for a layout class at most half of what is left of the call's deadline, so that
  // its answer (send_full_state) comes while the worker still waits for it.
  const absl::Duration left = absl::FromChrono(context->deadline()) - absl::Now();
  const absl::Time latest = clock_->Now() + std::max(left / 2, absl::ZeroDuration());
  if (!AdmitJoinBatch(*request, latest, [this, context, request, response, peer = *peer, reactor] {
        RunJoinBatch(context, request, response, peer, reactor);
      })) {
    return reactor;  // parked: answered when resumed
  }
  return RunJoinBatch(context, request, response, *peer, reactor);
}

namespace {

// Whether `join` carries its rank's description in full (it may be the one a layout class was
// asked of: its call's other joins may name that class).
bool DescribesInFull(const pb::JoinOperationRequest& join) {
  return !join.has_piece_list() && !join.state_omitted();
}

}  // namespace

bool CoordinatorService::AdmitJoinBatch(const pb::JoinOperationsRequest& request, absl::Time latest,
                                        PieceClasses::Resume resume) {
  std::set<std::string> digests;
  const std::string* job = nullptr;
  for (const pb::JoinOperationRequest& join : request.joins()) {
    // A call that describes a rank in full is never parked: it may bring the very class its
    // other joins name (a worker's rank asked for it re-sends beside ranks of the same class).
    if (DescribesInFull(join)) return true;
    if (!join.has_piece_list()) continue;
    if (job != nullptr && *job != join.job()) return true;  // several jobs: never parked
    job = &join.job();
    digests.insert(join.piece_list().class_digest());
  }
  if (digests.empty()) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return true;
  }
  return piece_classes_.Admit(*job, digests, clock_->Now(), latest, std::move(resume));
}

grpc::ServerUnaryReactor* CoordinatorService::RunJoinBatch(grpc::CallbackServerContext* context,
                                                           const pb::JoinOperationsRequest* request,
                                                           pb::JoinOperationsResponse* response,
                                                           const Peer& peer,
                                                           grpc::ServerUnaryReactor* reactor) {
  JoinBatch batch;
  batch.peer = peer;
  DeferredAnswer later;
  // Joins in full first, so that the call's joins by reference find the classes they bring.
  std::vector<int> order;
  for (int i = 0; i < request->joins_size(); ++i) {
    response->add_results();
    if (DescribesInFull(request->joins(i))) order.push_back(i);
  }
  for (int i = 0; i < request->joins_size(); ++i) {
    if (!DescribesInFull(request->joins(i))) order.push_back(i);
  }
  for (int i : order) {
    const pb::JoinOperationRequest& join = request->joins(i);
    pb::JoinResult* result = response->mutable_results(i);
    batch.result = result;
    DeferredAnswer one;
    const grpc::Status status =
        DoJoinOperation(context, &join, result->mutable_response(), &one, &batch.ready, &batch);
    if (!status.ok()) {
      result->clear_response();
      *result->mutable_status() = ToDetail(FromGrpcStatus(status));
    } else if (!one.operation_id.empty()) {
      if (later.operation_id.empty()) later.operation_id = one.operation_id;
      later.joins.push_back({one.operation_id, result});
    }
  }
  AnswerJoinBatch(batch);
  LogJoinBatch(batch);
  std::vector<PieceClasses::Resume> ready = std::move(batch.ready);
  grpc::ServerUnaryReactor* answered =
      AnswerNowOrAfterAdvance(context, grpc::Status::OK, std::move(later), reactor);
  RunResumes(std::move(ready));  // after this call's answer: the parked calls waited for it
  return answered;
}

void CoordinatorService::LogJoinBatch(const JoinBatch& batch) {
  if (batch.joined == 0) return;
  // At info: an operation's first call, each call that takes its joined ranks past another
  // tenth of the world, and the call that completes its gather; the others at debug. A line
  // per call (12,800 per operation at 102,400 ranks) cost a formatted, flushed write each.
  const int before = batch.joined_ranks - batch.joined;
  const int world = std::max(batch.world_size, 1);
  const bool milestone = before == 0 || batch.joined_ranks >= batch.world_size ||
                         int64_t{before} * 10 / world != int64_t{batch.joined_ranks} * 10 / world;
  spdlog::log(milestone ? spdlog::level::info : spdlog::level::debug,
              "ranks_joined op={} job={} ranks={} first={} last={} joined={}/{} by_digest={}",
              batch.operation_id, batch.job, batch.joined, batch.first_rank, batch.last_rank,
              batch.joined_ranks, batch.world_size, batch.by_digest);
}

void CoordinatorService::RunResumes(std::vector<PieceClasses::Resume> resumes) {
  for (PieceClasses::Resume& resume : resumes) resume();
}

void CoordinatorService::AnswerJoinBatch(const JoinBatch& batch) {
  if (batch.to_answer.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const DeferredJoin* answered = nullptr;  // the last operation's first answer, to copy
  for (const DeferredJoin& join : batch.to_answer) {
    if (answered != nullptr && join.operation_id == answered->operation_id) {
      *join.result->mutable_response()->mutable_operation() =
          answered->result->response().operation();
      continue;
    }
    // A gather this call completed is planned by the advancer (the call's last join waits for
    // it), never on this thread; the others see the planning phase.
    if (!NeedsAdvancer(join.operation_id)) Advance(join.operation_id);
    answered = AnswerJoin(join) ? &join : nullptr;
  }
}

grpc::ServerUnaryReactor* CoordinatorService::ReportProgress(
    grpc::CallbackServerContext* context, const pb::ReportProgressRequest* request,
    pb::ReportProgressResponse* response) {
  return Answer(context, DoReportProgress(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::ReportResult(grpc::CallbackServerContext* context,
                                                           const pb::ReportResultRequest* request,
                                                           pb::ReportResultResponse* response) {
  DeferredAnswer later;
  grpc::Status status = DoReportResult(context, request, response, &later);
  return AnswerNowOrAfterAdvance(context, std::move(status), std::move(later));
}

grpc::ServerUnaryReactor* CoordinatorService::RequestOperation(
    grpc::CallbackServerContext* context, const pb::RequestOperationRequest* request,
    pb::RequestOperationResponse* response) {
  return Answer(context, DoRequestOperation(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::PendingOperation(
    grpc::CallbackServerContext* context, const pb::PendingOperationRequest* request,
    pb::PendingOperationResponse* response) {
  return Answer(context, DoPendingOperation(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* context,
                                                        const pb::GetStatusRequest* request,
                                                        pb::GetStatusResponse* response) {
  return Answer(context, DoGetStatus(context, request, response));
}

grpc::ServerUnaryReactor* CoordinatorService::StartReshard(grpc::CallbackServerContext* context,
                                                           const pb::StartReshardRequest* request,
                                                           pb::StartReshardResponse* response) {
  DeferredAnswer later;
  grpc::Status status = DoStartReshard(context, request, response, &later);
  return AnswerNowOrAfterAdvance(context, std::move(status), std::move(later));
}

}  // namespace ckpt::coordinator
