#include "coordinator/job_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ckpt::coordinator {
namespace {

// Moves the bulky gathered fields of `from` into `to`.
void MoveGathered(RankEntry& from, RankEntry& to) {
  to.shards = std::move(from.shards);
  to.memory_kinds = std::move(from.memory_kinds);
  to.layouts = std::move(from.layouts);
  to.mesh_shape = std::move(from.mesh_shape);
  to.written = std::move(from.written);
  from.shards.clear();
  from.memory_kinds.clear();
  from.layouts.clear();
  from.mesh_shape.clear();
  from.written.clear();
}

// Adds context to a status while keeping its code.
absl::Status WithCode(absl::StatusCode code, std::string message) {
  return absl::Status(code, std::move(message));
}

constexpr int kMaxRanksNamed = 8;

}  // namespace

JobState::JobState(const Clock* clock, JobStateOptions options, std::string incarnation)
    : clock_(clock), options_(std::move(options)), incarnation_(std::move(incarnation)) {}

uint64_t JobState::OperationNumber(absl::string_view id) const {
  uint64_t n = 0;
  if (!absl::ConsumePrefix(&id, "op-")) return 0;
  if (!incarnation_.empty() &&
      !(absl::ConsumePrefix(&id, incarnation_) && absl::ConsumePrefix(&id, "-"))) {
    return 0;
  }
  if (!absl::SimpleAtoi(id, &n)) return 0;
  return n;
}

absl::Status JobState::UnknownOperation(absl::string_view operation_id) const {
  return absl::NotFoundError(absl::StrCat(
      "operation ", operation_id, " is unknown to this coordinator",
      incarnation_.empty() ? ""
                           : absl::StrCat(" (incarnation ", incarnation_,
                                          "; an id of another incarnation belongs to a "
                                          "coordinator process that has since restarted)")));
}

absl::Status JobState::AttachRank(absl::string_view job_name, int world_size, int rank,
                                  const RankLocation& location) {
  if (job_name.empty()) return absl::InvalidArgumentError("job name is empty");
  if (world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_name, ": world size ", world_size, " must be positive"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_name, ": rank ", rank, " is outside [0, ", world_size, ")"));
  }
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) {
    Job job;
    job.name = std::string(job_name);
    job.world_size = world_size;
    job.created = clock_->Now();
    it = jobs_.emplace(job.name, std::move(job)).first;
  } else if (it->second.world_size != world_size && it->second.ranks.empty() &&
             InFlight(job_name) == nullptr) {
    it->second.world_size = world_size;  // every rank left: the job restarts at a new size
    it->second.departed.clear();
  } else if (it->second.world_size != world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_name, " has world size ", it->second.world_size, " but rank ",
                     rank, " (", location.DebugString(), ") says ", world_size));
  }
  // One lookup, and no copy when nothing changed: every join of a rank comes here (102,400
  // times per save at 100k ranks, each a walk of a map of that many ranks).
  auto [attached, inserted] = it->second.ranks.try_emplace(rank, location);
  if (inserted && !it->second.departed.empty()) it->second.departed.erase(rank);
  if (!inserted) {
    if (attached->second.worker_id != location.worker_id) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job ", job_name, " rank ", rank, " is already attached (",
          attached->second.DebugString(), "); a second trainer claims it from ",
          location.DebugString(), " (check RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK)"));
    }
    if (attached->second == location) return absl::OkStatus();  // attached as it was
    attached->second = location;
  }
  ++version_;
  return absl::OkStatus();
}

std::vector<std::string> JobState::DetachRank(absl::string_view job_name, int rank,
                                              absl::string_view worker_id) {
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) return {};
  auto r = it->second.ranks.find(rank);
  if (r == it->second.ranks.end() || r->second.worker_id != worker_id) return {};
  it->second.departed[rank] = Job::Departed{r->second, clock_->Now()};
  it->second.ranks.erase(r);
  ++version_;
  Operation* op = nullptr;
  if (auto flight = in_flight_.find(job_name); flight != in_flight_.end()) {
    op = MutableOperation(flight->second);
  }
  if (op == nullptr || op->phase != Phase::kGathering || rank < 0 || rank >= op->world_size ||
      op->ranks[rank].joined) {
    return {};
  }
  AbortOperation(*op, absl::UnavailableError(
                          absl::StrCat(op->DebugString(), " aborted: ", DescribeRank(*op, rank),
                                       "; the operation cannot complete without it")));
  return {op->id};
}

Operation* JobState::CreateOperation(Job& job, OperationKind kind, absl::string_view path,
                                     std::string requested_by, absl::Duration arrival_deadline) {
  auto op = std::make_unique<Operation>();
  uint64_t number = next_operation_++;
  op->id = incarnation_.empty() ? absl::StrCat("op-", number)
                                : absl::StrCat("op-", incarnation_, "-", number);
  op->job = job.name;
  op->kind = kind;
  op->path = std::string(path);
  op->requested_by = std::move(requested_by);
  op->world_size = job.world_size;
  op->created = clock_->Now();
  op->ranks.resize(job.world_size);
  EnterPhase(*op, Phase::kGathering,
             op->created + (arrival_deadline > absl::ZeroDuration() ? arrival_deadline
                                                                    : options_.arrival_deadline));
  op->phase_since = op->created;
  Operation* raw = op.get();
  operations_.emplace(number, std::move(op));
  in_flight_[job.name] = raw->id;
  return raw;
}

absl::StatusOr<std::string> JobState::RequestOperation(absl::string_view job_name,
                                                       OperationKind kind, absl::string_view path,
                                                       absl::Duration arrival_deadline,
                                                       pb::LoadAlgorithm load_algorithm,
                                                       int64_t load_memory_budget_bytes,
                                                       const std::string& process_groups) {
  if (path.empty()) return absl::InvalidArgumentError("checkpoint path is empty");
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_name, " is unknown: no trainer rank of it has connected yet"));
  }
  if (const Operation* busy = InFlight(job_name)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_name, " already has ",
                                                      busy->DebugString(), " in phase ",
                                                      PhaseName(busy->phase)));
  }
  Operation* op = CreateOperation(it->second, kind, path, "operator", arrival_deadline);
  op->load_algorithm = load_algorithm;
  op->load_memory_budget_bytes = load_memory_budget_bytes;
  op->process_groups = process_groups;
  return op->id;
}

absl::Status JobState::SetPersistTo(absl::string_view operation_id, std::string path,
                                    bool overwrite) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kGathering) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set where ", op->DebugString(), " persists to: it is past gathering"));
  }
  op->persist_to = std::move(path);
  op->persist_overwrite = overwrite;
  return absl::OkStatus();
}

absl::Status JobState::SetCompression(absl::string_view operation_id, std::string spec) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kGathering) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set the compression of ", op->DebugString(), ": past gathering"));
  }
  op->compression = std::move(spec);
  return absl::OkStatus();
}

absl::Status JobState::SetOverwrite(absl::string_view operation_id) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kGathering) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot let ", op->DebugString(), " overwrite: it is past gathering"));
  }
  op->overwrite = true;
  return absl::OkStatus();
}

absl::Status JobState::SetMemoryReplicas(absl::string_view operation_id, int replicas) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kGathering) {
    return absl::FailedPreconditionError(absl::StrCat("cannot set the memory replicas of ",
                                                      op->DebugString(), ": it is past gathering"));
  }
  op->memory_replicas = replicas;
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobState::StartReshard(absl::string_view destination, ReshardSpec spec,
                                                   const std::vector<RankLocation>& locations) {
  if (destination.empty()) return absl::InvalidArgumentError("reshard destination is empty");
  if (spec.source.empty()) return absl::InvalidArgumentError("reshard source is empty");
  if (locations.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard into ", destination, ": the target layout has no ranks"));
  }
  for (size_t r = 0; r < locations.size(); ++r) {
    if (locations[r].worker_id.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshard into ", destination, ": rank ", r, " has no worker"));
    }
  }
  const std::string name = absl::StrCat("reshard:", destination);
  if (const Operation* busy = InFlight(name)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a reshard into ", destination, " is already in flight: ", busy->DebugString(),
                     " in phase ", PhaseName(busy->phase)));
  }
  Job& job = jobs_[name];
  if (job.name.empty()) {
    job.name = name;
    job.created = clock_->Now();
  }
  job.world_size = static_cast<int>(locations.size());
  job.ranks.clear();
  for (size_t r = 0; r < locations.size(); ++r) job.ranks[static_cast<int>(r)] = locations[r];
  Operation* op =
      CreateOperation(job, OperationKind::kReshard, destination, "operator", absl::ZeroDuration());
  op->reshard = std::move(spec);
  const absl::Time now = clock_->Now();
  for (size_t r = 0; r < locations.size(); ++r) {
    RankEntry& entry = op->ranks[r];
    entry.joined = true;
    ++op->totals.joined;
    entry.location = locations[r];
    entry.joined_at = now;
  }
  ++version_;
  EnterPhase(*op, Phase::kPlanning, now + options_.execution_deadline);
  return op->id;
}

const Operation* JobState::PendingForRank(absl::string_view job, int rank) const {
  const Operation* op = InFlight(job);
  if (op == nullptr || op->phase != Phase::kGathering || op->requested_by != "operator") {
    return nullptr;
  }
  if (rank < 0 || rank >= static_cast<int>(op->ranks.size()) || op->ranks[rank].joined) {
    return nullptr;
  }
  return op;
}

namespace {

// The operation's options from the first join that gives each (metadata, load options,
// memory replicas, persistence; overwrite from any join that asks for it).
void TakeJoinOptions(JoinRequest& request, Operation* op) {
  if (op->metadata.empty()) op->metadata = std::move(request.metadata);
  if (op->load_algorithm == pb::LOAD_ALGORITHM_UNSPECIFIED) {
    op->load_algorithm = request.load_algorithm;
  }
  if (op->load_memory_budget_bytes <= 0) {
    op->load_memory_budget_bytes = request.load_memory_budget_bytes;
  }
  if (op->memory_replicas < 0) op->memory_replicas = request.memory_replicas;
  if (op->persist_to.empty() && !request.persist_to.empty()) {
    op->persist_to = std::move(request.persist_to);
    op->persist_overwrite = request.persist_overwrite;
  }
  if (op->process_groups.empty()) op->process_groups = std::move(request.process_groups);
  if (op->compression.empty()) op->compression = std::move(request.compression);
  op->overwrite = op->overwrite || request.overwrite;  // any rank asking for it decides
}

}  // namespace

absl::StatusOr<const Operation*> JobState::JoinOperation(JoinRequest request) {
  if (request.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", request.job, " rank ", request.rank, ": checkpoint path is empty"));
  }
  if (!request.operation_id.empty()) {
    Operation* named = MutableOperation(request.operation_id);
    if (named == nullptr) {
      return absl::NotFoundError(absl::StrCat("job ", request.job, " rank ", request.rank,
                                              ": operation ", request.operation_id,
                                              " is unknown (or long finished)"));
    }
    if (named->job != request.job) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank, " of job ", request.job,
                                                     " cannot join ", named->DebugString()));
    }
    if (named->phase == Phase::kAborted) return named->status;
  }
  if (absl::Status s = AttachRank(request.job, request.world_size, request.rank, request.location);
      !s.ok()) {
    return s;
  }
  Job& job = jobs_.find(request.job)->second;
  Operation* op = nullptr;
  auto flight = in_flight_.find(request.job);
  if (flight != in_flight_.end()) op = MutableOperation(flight->second);
  if (!request.operation_id.empty() && (op == nullptr || op->id != request.operation_id)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", request.job, " rank ", request.rank,
                                                      ": operation ", request.operation_id,
                                                      " is no longer in flight"));
  }
  if (op == nullptr) {
    // A trainer may shorten the coordinator's arrival deadline, not lengthen it (operators
    // lengthen it through RequestOperation).
    const absl::Duration arrival =
        request.arrival_deadline > absl::ZeroDuration()
            ? std::min(request.arrival_deadline, options_.arrival_deadline)
            : absl::ZeroDuration();
    op = CreateOperation(job, request.kind, request.path, absl::StrCat("rank ", request.rank),
                         arrival);
  }
  if (op->kind != request.kind || op->path != request.path) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", request.job, " rank ", request.rank, " asked to ",
                     OperationKindName(request.kind), " ", request.path, " but ", op->DebugString(),
                     " is in flight (phase ", PhaseName(op->phase), ")"));
  }
  RankEntry& entry = op->ranks[request.rank];
  if (entry.joined) return op;  // idempotent retry
  if (op->phase != Phase::kGathering) {
    return absl::FailedPreconditionError(absl::StrCat("job ", request.job, " rank ", request.rank,
                                                      " arrived too late: ", op->DebugString(),
                                                      " is already ", PhaseName(op->phase)));
  }
  entry.joined = true;
  ++op->totals.joined;
  if (request.described_by_digest) ++op->ranks_described_by_digest;
  entry.description_digest = std::move(request.description_digest);
  entry.held_plan_part_body = std::move(request.held_plan_part_body);
  entry.location = std::move(request.location);  // AttachRank above has its own copy
  entry.joined_at = clock_->Now();
  entry.shards = request.pieces.empty() && !request.shards.empty()
                     ? RankPieces(std::move(request.shards))
                     : std::move(request.pieces);
  piece_lists_.Intern(&entry.shards);
  entry.memory_kinds = std::move(request.memory_kinds);
  entry.layouts = std::move(request.layouts);
  entry.mesh_shape = std::move(request.mesh_shape);
  TakeJoinOptions(request, op);
  ++version_;
  if (op->JoinedRanks() == op->world_size) {
    EnterPhase(*op, Phase::kPlanning, clock_->Now() + options_.execution_deadline);
  }
  return op;
}

absl::Status JobState::SetPlan(absl::string_view operation_id, std::vector<RankPlan> plans) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kPlanning) {
    return absl::FailedPreconditionError(absl::StrCat("cannot set the plan of ", op->DebugString(),
                                                      " in phase ", PhaseName(op->phase)));
  }
  if (static_cast<int>(plans.size()) < op->world_size) {
    return absl::InvalidArgumentError(absl::StrCat("plan of ", op->DebugString(), " has ",
                                                   plans.size(), " parts for world size ",
                                                   op->world_size));
  }
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    if (plans[r].bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan of ", op->DebugString(), ": rank ", r, " has negative bytes"));
    }
    if ((r >= op->world_size) != plans[r].serving.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan of ", op->DebugString(), ": part ", r,
                       r >= op->world_size ? " is past the world size without a serving worker"
                                           : " of a job rank names a serving worker"));
    }
  }
  // Serving participants (receives): ranks past the world size, joined at once on their worker.
  for (int r = op->world_size; r < static_cast<int>(plans.size()); ++r) {
    RankEntry serving;
    serving.joined = true;
    serving.joined_at = clock_->Now();
    serving.location = *plans[r].serving;
    serving.serving = true;
    serving.serving_source = plans[r].serving_source;
    op->ranks.push_back(std::move(serving));
  }
  op->serving_ranks = static_cast<int>(plans.size()) - op->world_size;
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    op->plan_reused = op->plan_reused || plans[r].reused;
    op->received_version = std::max(op->received_version, plans[r].received_version);
    op->ranks[r].has_plan = true;
    op->ranks[r].plan_part = std::move(plans[r].part);
    op->totals.bytes_total += plans[r].bytes - op->ranks[r].bytes_total;
    op->ranks[r].bytes_total = plans[r].bytes;
  }
  EnterPhase(*op, Phase::kExecuting, op->deadline);  // the execution deadline keeps running
  return absl::OkStatus();
}

absl::Status JobState::ReportProgress(absl::string_view operation_id, int rank,
                                      int64_t bytes_done) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (rank < 0 || rank >= static_cast<int>(op->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op->DebugString(), ": rank ", rank, " is outside the job"));
  }
  if (op->phase != Phase::kExecuting) {
    if (op->phase == Phase::kAborted) return op->status;
    return absl::FailedPreconditionError(
        absl::StrCat(op->DebugString(), " is ", PhaseName(op->phase), ", not executing"));
  }
  RankEntry& entry = op->ranks[rank];
  int64_t capped = std::min(std::max<int64_t>(bytes_done, 0), entry.bytes_total);
  if (capped > entry.bytes_done) {
    op->totals.bytes_done += capped - entry.bytes_done;
    entry.bytes_done = capped;
    ++version_;
  }
  return absl::OkStatus();
}

absl::Status JobState::ReportResult(absl::string_view operation_id, int rank,
                                    const absl::Status& result, std::string written,
                                    int64_t bytes_read) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (rank < 0 || rank >= static_cast<int>(op->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op->DebugString(), ": rank ", rank, " is outside the job"));
  }
  if (op->phase == Phase::kAborted) return op->status;
  if (op->phase != Phase::kExecuting) {
    return absl::FailedPreconditionError(
        absl::StrCat(op->DebugString(), " is ", PhaseName(op->phase), ", not executing"));
  }
  RankEntry& entry = op->ranks[rank];
  if (entry.result.has_value()) return absl::OkStatus();  // idempotent retry
  entry.result = result;
  ++op->totals.reported;
  ++version_;
  if (!result.ok()) {
    AbortOperation(*op, WithCode(result.code(), absl::StrCat(op->DebugString(),
                                                             " aborted: ", DescribeRank(*op, rank),
                                                             " failed: ", result.message())));
    return absl::OkStatus();
  }
  op->totals.bytes_done += entry.bytes_total - entry.bytes_done;
  entry.bytes_done = entry.bytes_total;
  entry.written = std::move(written);
  op->totals.bytes_read += bytes_read - entry.bytes_read;
  entry.bytes_read = bytes_read;
  if (op->ReportedRanks() == static_cast<int>(op->ranks.size())) {
    if (op->kind == OperationKind::kLoad) {
      Finish(*op, Phase::kDone);
    } else {
      EnterPhase(*op, Phase::kCommitting, absl::InfiniteFuture());
    }
  }
  return absl::OkStatus();
}

absl::Status JobState::FinishCommit(absl::string_view operation_id, const absl::Status& result) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (op->phase != Phase::kCommitting) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot commit ", op->DebugString(), " in phase ", PhaseName(op->phase)));
  }
  if (result.ok()) {
    Finish(*op, Phase::kDone);
  } else {
    AbortOperation(
        *op, WithCode(result.code(), absl::StrCat(op->DebugString(),
                                                  " aborted: commit failed: ", result.message())));
  }
  return absl::OkStatus();
}

absl::Status JobState::Abort(absl::string_view operation_id, const absl::Status& cause) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  if (IsFinal(op->phase) || op->phase == Phase::kCommitting) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot abort ", op->DebugString(), " in phase ", PhaseName(op->phase)));
  }
  AbortOperation(*op, WithCode(cause.ok() ? absl::StatusCode::kAborted : cause.code(),
                               absl::StrCat(op->DebugString(), " aborted: ", cause.message())));
  return absl::OkStatus();
}

std::vector<std::string> JobState::WorkerLost(absl::string_view worker_id,
                                              absl::string_view cause) {
  std::vector<std::string> aborted;
  std::vector<std::string> ids;
  for (const auto& [job, id] : in_flight_) ids.push_back(id);
  for (const std::string& id : ids) {
    Operation* op = MutableOperation(id);
    if (op == nullptr || IsFinal(op->phase) || op->phase == Phase::kCommitting) continue;
    std::vector<int> affected;
    const Job* job = FindJob(op->job);
    for (int r = 0; r < static_cast<int>(op->ranks.size()); ++r) {
      const RankEntry& e = op->ranks[r];
      bool on_worker = e.joined ? e.location.worker_id == worker_id : false;
      if (!e.joined && job != nullptr) {
        auto it = job->ranks.find(r);
        on_worker = it != job->ranks.end() && it->second.worker_id == worker_id;
      }
      if (on_worker) affected.push_back(r);
    }
    if (affected.empty()) continue;
    std::vector<std::string> named;
    for (size_t i = 0; i < affected.size() && i < kMaxRanksNamed; ++i) {
      named.push_back(DescribeRank(*op, affected[i]));
    }
    if (affected.size() > kMaxRanksNamed) {
      named.push_back(absl::StrCat("and ", affected.size() - kMaxRanksNamed, " more"));
    }
    AbortOperation(
        *op, absl::UnavailableError(absl::StrCat(op->DebugString(), " aborted: the worker of ",
                                                 absl::StrJoin(named, "; "), " ", cause)));
    aborted.push_back(id);
  }
  // Its trainers are unreachable now; a worker that comes back attaches them again.
  for (auto& [name, job] : jobs_) {
    for (auto r = job.ranks.begin(); r != job.ranks.end();) {
      r = r->second.worker_id == worker_id ? job.ranks.erase(r) : std::next(r);
    }
  }
  ++version_;
  return aborted;
}

std::vector<std::string> JobState::Tick() {
  absl::Time now = clock_->Now();
  std::vector<std::string> aborted;
  std::vector<std::string> ids;
  for (const auto& [job, id] : in_flight_) ids.push_back(id);
  for (const std::string& id : ids) {
    Operation* op = MutableOperation(id);
    if (op == nullptr || IsFinal(op->phase) || op->phase == Phase::kCommitting) continue;
    if (now < op->deadline) continue;
    std::vector<int> late;
    for (int r = 0; r < static_cast<int>(op->ranks.size()); ++r) {
      const RankEntry& e = op->ranks[r];
      bool is_late = op->phase == Phase::kGathering   ? !e.joined
                     : op->phase == Phase::kExecuting ? !e.result.has_value()
                                                      : false;
      if (is_late) late.push_back(r);
    }
    std::vector<std::string> named;
    for (size_t i = 0; i < late.size() && i < kMaxRanksNamed; ++i) {
      named.push_back(DescribeRank(*op, late[i]));
    }
    if (late.size() > kMaxRanksNamed) {
      named.push_back(absl::StrCat("and ", late.size() - kMaxRanksNamed, " more"));
    }
    std::string who = absl::StrJoin(named, "; ");
    std::string why;
    if (op->phase == Phase::kGathering) {
      absl::Duration allowed = absl::Trunc(op->deadline - op->created, absl::Milliseconds(1));
      why = absl::StrCat(who, " did not join within ", absl::FormatDuration(allowed));
    } else if (op->phase == Phase::kPlanning) {
      why = absl::StrCat("planning did not finish within the execution deadline (",
                         absl::FormatDuration(options_.execution_deadline), ")");
    } else {
      why = absl::StrCat(who, " did not report a result within the execution deadline (",
                         absl::FormatDuration(options_.execution_deadline), ")");
    }
    AbortOperation(*op,
                   absl::DeadlineExceededError(absl::StrCat(op->DebugString(), " aborted: ", why)));
    aborted.push_back(id);
  }
  return aborted;
}

absl::StatusOr<Operation> JobState::LendGathered(absl::string_view operation_id) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  std::vector<RankEntry> bulky(op->ranks.size());
  std::vector<PlanPartBytes> parts(op->ranks.size());
  for (size_t r = 0; r < op->ranks.size(); ++r) {
    MoveGathered(op->ranks[r], bulky[r]);
    std::swap(parts[r], op->ranks[r].plan_part);
  }
  Operation lent = *op;  // small now: no pieces, no plan parts
  for (size_t r = 0; r < op->ranks.size(); ++r) {
    MoveGathered(bulky[r], lent.ranks[r]);
    std::swap(parts[r], op->ranks[r].plan_part);
  }
  return lent;
}

absl::StatusOr<Operation> JobState::CopyWithoutRanks(absl::string_view operation_id) {
  Operation* op = MutableOperation(operation_id);
  if (op == nullptr) return UnknownOperation(operation_id);
  std::vector<RankEntry> ranks = std::move(op->ranks);
  Operation copy = *op;
  op->ranks = std::move(ranks);
  return copy;
}

std::vector<std::vector<RankEntry>> JobState::TakeReleased() {
  return std::exchange(released_, {});
}

void JobState::ReturnLent(absl::string_view operation_id, Operation lent) {
  Operation* op = MutableOperation(operation_id);
  // An operation that ended meanwhile keeps nothing (see Finish).
  if (op == nullptr || IsFinal(op->phase) || op->ranks.size() != lent.ranks.size()) return;
  for (size_t r = 0; r < op->ranks.size(); ++r) MoveGathered(lent.ranks[r], op->ranks[r]);
}

const Operation* JobState::FindOperation(absl::string_view operation_id) const {
  auto it = operations_.find(OperationNumber(operation_id));
  return it == operations_.end() ? nullptr : it->second.get();
}

Operation* JobState::MutableOperation(absl::string_view operation_id) {
  auto it = operations_.find(OperationNumber(operation_id));
  return it == operations_.end() ? nullptr : it->second.get();
}

const Job* JobState::FindJob(absl::string_view job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Operation* JobState::InFlight(absl::string_view job) const {
  auto it = in_flight_.find(job);
  return it == in_flight_.end() ? nullptr : FindOperation(it->second);
}

std::vector<const Job*> JobState::Jobs() const {
  std::vector<const Job*> out;
  for (const auto& [name, job] : jobs_) out.push_back(&job);
  return out;
}

std::vector<const Operation*> JobState::Operations() const {
  std::vector<const Operation*> out;
  for (const auto& [number, op] : operations_) out.push_back(op.get());
  return out;
}

void JobState::EnterPhase(Operation& op, Phase phase, absl::Time deadline) {
  op.phase = phase;
  op.phase_since = clock_->Now();
  op.deadline = deadline;
  ++version_;
  ++phase_version_;
}

void JobState::AbortOperation(Operation& op, absl::Status cause) {
  op.status = std::move(cause);
  Finish(op, Phase::kAborted);
}

void JobState::Finish(Operation& op, Phase final_phase) {
  EnterPhase(op, final_phase, absl::InfiniteFuture());
  // Nothing reads an ended operation's pieces, records or plan parts (status answers use
  // the totals): free them now, not when the operation is pruned 32 operations later (at
  // 10k ranks each kept save held ~2 GiB of gathered pieces).
  // Moved aside here (O(ranks) moves) and destroyed by whoever calls TakeReleased, without the
  // service's lock: destroying 6M pieces under it took 17 s at 20k ranks on a loaded machine.
  std::vector<RankEntry>& released = released_.emplace_back(op.ranks.size());
  for (size_t r = 0; r < op.ranks.size(); ++r) {
    MoveGathered(op.ranks[r], released[r]);
    released[r].plan_part = std::exchange(op.ranks[r].plan_part, PlanPartBytes());
  }
  op.finished = op.phase_since;
  if (op.kind == OperationKind::kReshard) {
    // A cluster reshard's ranks were placed on workers for this operation only: once it ended
    // nothing runs them (a refused 10^6-rank reshard left 10^6 of them in every status answer).
    if (auto job = jobs_.find(op.job); job != jobs_.end()) job->second.ranks.clear();
    ++version_;
  }
  auto it = in_flight_.find(op.job);
  if (it != in_flight_.end() && it->second == op.id) in_flight_.erase(it);
  PruneFinished(op.job);
}

void JobState::PruneFinished(absl::string_view job) {
  int finished = 0;
  for (auto it = operations_.rbegin(); it != operations_.rend(); ++it) {
    if (it->second->job == job && IsFinal(it->second->phase)) ++finished;
  }
  for (auto it = operations_.begin();
       it != operations_.end() && finished > options_.finished_operations_kept;) {
    if (it->second->job == job && IsFinal(it->second->phase)) {
      it = operations_.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

std::string JobState::DescribeRank(const Operation& op, int rank) const {
  const RankEntry& e = op.ranks[rank];
  if (e.serving) {
    return absl::StrCat("serving rank ", rank, " (", e.location.DebugString(), ", serving ",
                        e.serving_source, ")");
  }
  if (e.joined) return absl::StrCat("rank ", rank, " (", e.location.DebugString(), ")");
  const Job* job = FindJob(op.job);
  if (job != nullptr) {
    auto it = job->ranks.find(rank);
    if (it != job->ranks.end()) {
      return absl::StrCat("rank ", rank, " (", it->second.DebugString(), ")");
    }
  }
  if (job != nullptr) {
    auto it = job->departed.find(rank);
    if (it != job->departed.end()) {
      return absl::StrCat(
          "rank ", rank, " (its trainer connected through ", it->second.location.DebugString(),
          ", then left it at ",
          absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", it->second.left, absl::UTCTimeZone()),
          " before joining: it exited or said goodbye)");
    }
  }
  return absl::StrCat("rank ", rank, " (its trainer never connected to a worker)");
}

}  // namespace ckpt::coordinator
