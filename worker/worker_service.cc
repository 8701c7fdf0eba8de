#include "worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "planner/rank_description.h"
#include "proto/compact_convert.h"
#include "proto/operation_phase.h"
#include "proto/state_digest.h"
#include "proto/status_detail.h"
#include "proto/wire_names.h"
#include "spdlog/spdlog.h"
#include "storage/piece_codec.h"
#include "worker/part_executors.h"
#include "worker/transfer_serve.h"

namespace ckpt::worker {
namespace {

// How long Hello waits for the worker's first registration.
constexpr absl::Duration kRegistrationWait = absl::Seconds(5);

// The worker's CoordinatorJoins: calls JoinOperations through `link`, lingering up to
// `linger` for the job's ranks open in `registry`.
CoordinatorJoins MakeCoordinatorJoins(CoordinatorLink* link, MemoryRegistry* registry,
                                      absl::Duration linger) {
  CoordinatorJoins::Options options;
  options.peers = [registry](const std::string& job) { return registry->SessionsOfJob(job); };
  options.linger = linger;
  return CoordinatorJoins(
      [link](
          const pb::JoinOperationsRequest& request) -> absl::StatusOr<pb::JoinOperationsResponse> {
        pb::JoinOperationsResponse response;
        absl::Status s =
            FromGrpcStatus(link->stub()->JoinOperations(link->Context().get(), request, &response));
        if (!s.ok()) return s;
        return response;
      },
      std::move(options));
}

}  // namespace

WorkerService::WorkerService(MemoryRegistry* registry, CoordinatorLink* link, std::string host,
                             PinnedStagingPool* device_staging, absl::Duration join_linger)
    : registry_(registry),
      link_(link),
      host_(std::move(host)),
      coordinator_joins_(MakeCoordinatorJoins(link, registry, join_linger)) {
  RegisterPartExecutor(
      pb::OPERATION_SAVE,
      std::make_unique<SavePartExecutor>(
          [this](const std::string& op, int rank, const pb::SaveSnapshotReport& report) {
            MarkSnapshotted(op, rank, report);
          },
          device_staging,
          LoadEnvironment{link_, host_, &gloo_loop_thread_nice_, &stopping_, nullptr,
                          &memory_tier_},
          &host_save_));
  RegisterPartExecutor(pb::OPERATION_LOAD, std::make_unique<LoadPartExecutor>(LoadEnvironment{
                                               link_, host_, &gloo_loop_thread_nice_, &stopping_,
                                               device_staging, &memory_tier_}));
  RegisterPartExecutor(pb::OPERATION_RESHARD, std::make_unique<ReshardPartExecutor>(&host_save_));
  // Live transfer: this worker's part as a serving participant of another job's receive.
  RegisterPartExecutor(
      pb::OPERATION_RECEIVE,
      std::make_unique<TransferServeExecutor>(LoadEnvironment{link_, host_, &gloo_loop_thread_nice_,
                                                              &stopping_, nullptr, &memory_tier_}));
}

std::string WorkerService::CoordinatorCall(absl::string_view call) const {
  return absl::StrCat(call, " from host ", host_, " to coordinator ", link_->options().coordinator);
}

absl::Status WorkerService::Attach(const SessionInfo& session, const std::string& worker_id) {
  pb::AttachRankRequest request;
  request.set_job(session.trainer.job);
  request.set_world_size(session.trainer.world_size);
  request.set_rank(session.trainer.rank);
  request.set_worker_id(worker_id);
  request.set_trainer_pid(session.trainer.pid);
  pb::AttachRankResponse response;
  return FromGrpcStatus(link_->stub()->AttachRank(link_->Context().get(), request, &response),
                        CoordinatorCall("AttachRank"));
}

absl::StatusOr<TrainerCredentials> WorkerService::Caller(const grpc::ServerContext& context) const {
  if (trainer_socket_ == nullptr) {
    return absl::InternalError("the worker serves trainers without its trainer socket");
  }
  return trainer_socket_->CallerOf(context);
}

absl::StatusOr<SessionInfo> WorkerService::CallerSession(const grpc::ServerContext& context,
                                                         const std::string& session_id) const {
  absl::StatusOr<TrainerCredentials> caller = Caller(context);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<SessionInfo> session = registry_->Find(session_id);
  if (!session.ok()) return session.status();
  if (session->trainer.uid != caller->uid) {
    return absl::PermissionDeniedError(absl::StrCat("trainer session ", session_id,
                                                    " belongs to uid ", session->trainer.uid,
                                                    ", not to the caller's uid ", caller->uid));
  }
  return session;
}

grpc::Status WorkerService::Hello(grpc::ServerContext* context, const pb::TrainerHello* request,
                                  pb::TrainerHelloResponse* response) {
  // Who connected is the kernel's word (SO_PEERCRED), not the request's.
  absl::StatusOr<TrainerCredentials> caller = Caller(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (context->IsCancelled()) return grpc::Status::CANCELLED;  // its connection may be reused
  if (request->pid() != 0 && request->pid() != caller->pid) {
    spdlog::warn("trainer_pid_claim_ignored claimed={} connected_pid={} uid={}", request->pid(),
                 caller->pid, caller->uid);
  }
  TrainerIdentity trainer{request->job(),        request->rank(), request->world_size(),
                          request->local_rank(), caller->pid,     caller->uid};
  if (absl::Status s = link_->WaitRegistered(kRegistrationWait); !s.ok()) return ToGrpcStatus(s);
  // A trainer that died a moment ago must not block its replacement.
  for (const SessionInfo& gone : registry_->ReapDeadTrainers()) OnTrainerGone(gone);
  for (const SessionInfo& other : registry_->Sessions()) {
    if (other.trainer.job == trainer.job && other.trainer.rank == trainer.rank) {
      return ToGrpcStatus(absl::AlreadyExistsError(absl::StrCat(
          "job ", trainer.job, " rank ", trainer.rank, " is already connected to this worker (pid ",
          other.trainer.pid, "); pid ", trainer.pid,
          " claims it too (check RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK)")));
    }
  }
  absl::StatusOr<std::string> session = registry_->OpenSession(trainer);
  if (!session.ok()) return ToGrpcStatus(session.status());
  absl::StatusOr<SessionInfo> info = registry_->Find(*session);
  std::string worker_id = link_->worker_id();
  absl::Status attached = info.ok() ? Attach(*info, worker_id) : info.status();
  if (!attached.ok() && info.ok() && !link_->ConfirmRegistration(worker_id)) {
    // The coordinator no longer knows this worker (it restarted, or declared the worker dead,
    // before the link noticed): register again and attach under the new id.
    spdlog::info("trainer_hello_registers_again job={} rank={} why=\"{}\"", trainer.job,
                 trainer.rank, std::string(attached.message()));
    attached = link_->WaitRegistered(kRegistrationWait);
    if (attached.ok()) {
      worker_id = link_->worker_id();
      attached = Attach(*info, worker_id);
    }
  }
  if (!attached.ok()) {
    (void)registry_->CloseSession(*session);
    return ToGrpcStatus(attached);
  }
  spdlog::info("trainer_hello session={} job={} rank={} world_size={} local_rank={} pid={}",
               *session, trainer.job, trainer.rank, trainer.world_size, trainer.local_rank,
               trainer.pid);
  response->set_worker_id(worker_id);
  response->set_session_id(*session);
  response->set_host(host_);
  response->set_worker_pid(getpid());
  return grpc::Status::OK;
}

grpc::Status WorkerService::RegisterTensors(grpc::ServerContext* context,
                                            const pb::RegisterTensorsRequest* request,
                                            pb::RegisterTensorsResponse* response) {
  if (auto session = CallerSession(*context, request->session_id()); !session.ok()) {
    return ToGrpcStatus(session.status());
  }
  std::vector<pb::SharedTensor> tensors(request->tensors().begin(), request->tensors().end());
  absl::Status s = registry_->RegisterTensors(request->session_id(), tensors);
  if (!s.ok()) return ToGrpcStatus(s);
  int64_t host_bytes = 0;
  for (const pb::SharedTensor& t : tensors) {
    if (t.memory_kind() == pb::MEMORY_HOST) host_bytes += t.nbytes();
  }
  response->set_host_bytes(host_bytes);
  spdlog::debug("tensors_registered session={} tensors={} host_bytes={}", request->session_id(),
                tensors.size(), host_bytes);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Transfer(const pb::TransferRequest& request, pb::OperationKind kind,
                                     pb::TransferResponse* response) {
  absl::StatusOr<SessionInfo> session = registry_->Find(request.session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (absl::StatusOr<CompressionOptions> c = ParseCompression(request.compression()); !c.ok()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError(absl::StrCat("rank ", session->trainer.rank, " of job ",
                                                session->trainer.job, ": ", c.status().message())));
  }
  std::string worker_id = link_->worker_id();
  if (worker_id.empty()) {
    return ToGrpcStatus(link_->WaitRegistered(absl::ZeroDuration()));
  }
  pb::JoinOperationRequest join;
  join.set_job(session->trainer.job);
  join.set_world_size(session->trainer.world_size);
  join.set_rank(session->trainer.rank);
  join.set_kind(kind);
  join.set_path(request.path());
  join.set_worker_id(worker_id);
  join.set_operation_id(request.operation_id());
  join.mutable_metadata()->insert(request.metadata().begin(), request.metadata().end());
  join.set_load_algorithm(request.load_algorithm());
  join.set_load_memory_budget_bytes(request.memory_budget_bytes());
  if (request.has_memory_replicas()) join.set_memory_replicas(request.memory_replicas());
  join.set_persist_to(request.persist_to());
  join.set_persist_overwrite(request.persist_overwrite());
  join.set_process_groups(request.process_groups());
  join.set_compression(request.compression());
  join.set_overwrite(request.overwrite());
  join.set_arrival_deadline_ms(std::max<int64_t>(request.timeout_ms(), 0));
  if (kind == pb::OPERATION_SAVE) {
    join.set_held_plan_part_body(kept_parts_.Held(join.job(), join.rank()));
  }
  pb::RankState* state = join.mutable_state();
  state->set_rank(session->trainer.rank);
  // DTensors go compactly where their layout reproduces their piece (issue 16).
  RankStateWriter writer(state, /*with_kinds_and_layouts=*/true);
  for (const RegisteredTensor& t : session->tensors) {
    writer.Add(t.shard, t.memory_kind, t.layout, t.mesh_shape, t.mesh_coordinate);
    if (state->mesh_shape_size() == 0 && !t.mesh_shape.empty()) {
      state->mutable_mesh_shape()->Add(t.mesh_shape.begin(), t.mesh_shape.end());
    }
  }
  pb::JoinOperationResponse joined;
  bool by_class = false;
  absl::Status s = JoinSendingDigest(join, &joined, &by_class);
  if (!s.ok()) return ToGrpcStatus(s);
  spdlog::info(
      "operation_joined op={} job={} rank={} kind={} path={} shards={} compact={} by_digest={} "
      "by_class={}",
      joined.operation().id(), join.job(), join.rank(), pb::OperationKind_Name(kind), join.path(),
      join.state().shards_size(), join.state().compact_tensors_size(),
      join.state_omitted() && !by_class, by_class);
  response->set_operation_id(joined.operation().id());
  return grpc::Status::OK;
}

absl::Status WorkerService::JoinCoalesced(const pb::JoinOperationRequest& join,
                                          pb::JoinOperationResponse* joined) {
  // Read before the call that carries this join is sent: if that stream is still open when a
  // trainer waits, it brings the operation's end (worker/operation_ends.h).
  OperationEnds& ends = link_->operation_ends();
  const uint64_t stream = ends.OpenStream();
  absl::StatusOr<pb::JoinOperationResponse> answer = coordinator_joins_.Join(join);
  if (!answer.ok()) {
    return WithContext(answer.status(), absl::StrCat(CoordinatorCall("JoinOperation"), ": "));
  }
  *joined = *std::move(answer);
  if (!joined->send_full_state()) {
    const pb::OperationStatus& op = joined->operation();
    ends.Joined(op.id(), stream);
    if (IsFinal(op.phase())) ends.Ended(op, /*from_stream=*/false);
  }
  return absl::OkStatus();
}

absl::Status WorkerService::JoinSendingDigest(pb::JoinOperationRequest& join,
                                              pb::JoinOperationResponse* joined, bool* by_class) {
  const std::pair<std::string, int> key(join.job(), join.rank());
  // A description without compact tensors goes by reference to its layout class (its digest
  // and the rank's column, planner/rank_description.h) unless it is unchanged (digest only).
  std::optional<DescriptionSplit> split;
  if (join.state().compact_tensors_size() == 0 && join.state().shards_size() > 0) {
    absl::StatusOr<DescriptionSplit> s = SplitDescription(join.state());
    if (s.ok()) split = *std::move(s);
  }
  join.set_state_digest(split.has_value() ? split->digest : DescriptionDigest(join.state()));
  bool unchanged;
  {
    std::lock_guard<std::mutex> lock(digests_mu_);
    auto it = joined_digests_.find(key);
    unchanged = it != joined_digests_.end() && it->second == join.state_digest();
  }
  // Either way `state` holds the description meanwhile: a join by reference is state_omitted
  // too, so a coordinator that predates references looks its digest up and asks for it.
  pb::RankState state;
  join.set_state_omitted(unchanged || split.has_value());
  if (join.state_omitted()) state.Swap(join.mutable_state());
  if (!unchanged && split.has_value()) {
    join.mutable_state()->set_rank(state.rank());
    join.mutable_piece_list()->set_class_digest(split->class_digest);
    *join.mutable_piece_list()->mutable_column() = std::move(split->column);
  }
  absl::Status s = JoinCoalesced(join, joined);
  if (s.ok() && join.state_omitted() && joined->send_full_state()) {
    spdlog::info("join_sends_full_state job={} rank={} why=\"{}\"", join.job(), join.rank(),
                 joined->send_full_state_reason());
    join.mutable_state()->Swap(&state);
    join.set_state_omitted(false);
    join.clear_piece_list();
    joined->Clear();
    s = JoinCoalesced(join, joined);
  }
  if (s.ok() && joined->send_full_state()) {
    return absl::InternalError(
        absl::StrCat("coordinator asked job ", join.job(), " rank ", join.rank(),
                     " for the full state it was sent: ", joined->send_full_state_reason()));
  }
  if (by_class != nullptr) *by_class = s.ok() && join.has_piece_list();
  if (join.state_omitted()) {  // for the caller's log
    join.mutable_state()->Swap(&state);
    join.clear_piece_list();
  }
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(digests_mu_);
  if (joined->state_kept() || (unchanged && join.state_omitted())) {
    joined_digests_[key] = join.state_digest();
  } else {
    joined_digests_.erase(key);  // not kept (or an older coordinator): send it in full again
  }
  return absl::OkStatus();
}

grpc::Status WorkerService::Save(grpc::ServerContext* context, const pb::TransferRequest* request,
                                 pb::TransferResponse* response) {
  if (auto session = CallerSession(*context, request->session_id()); !session.ok()) {
    return ToGrpcStatus(session.status());
  }
  return Transfer(*request, pb::OPERATION_SAVE, response);
}

grpc::Status WorkerService::Load(grpc::ServerContext* context, const pb::TransferRequest* request,
                                 pb::TransferResponse* response) {
  if (auto session = CallerSession(*context, request->session_id()); !session.ok()) {
    return ToGrpcStatus(session.status());
  }
  return Transfer(*request, pb::OPERATION_LOAD, response);
}

grpc::Status WorkerService::Poll(grpc::ServerContext* context, const pb::PollRequest* request,
                                 pb::PollResponse* response) {
  absl::StatusOr<SessionInfo> session = CallerSession(*context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  pb::PendingOperationRequest pending;
  pending.set_job(session->trainer.job);
  pending.set_rank(session->trainer.rank);
  pb::PendingOperationResponse answer;
  absl::Status s =
      FromGrpcStatus(link_->stub()->PendingOperation(link_->Context().get(), pending, &answer),
                     CoordinatorCall("PendingOperation"));
  if (!s.ok()) return ToGrpcStatus(s);
  response->set_pending(answer.pending());
  if (answer.pending()) {
    response->set_operation_id(answer.operation_id());
    response->set_kind(answer.kind());
    response->set_path(answer.path());
  }
  return grpc::Status::OK;
}

void WorkerService::MarkSnapshotted(const std::string& operation_id, int rank,
                                    const pb::SaveSnapshotReport& report) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshotted_.emplace_back(absl::StrCat(operation_id, "/", rank), report);
  if (snapshotted_.size() > 4096) snapshotted_.pop_front();
  snapshot_cv_.notify_all();
}

const pb::SaveSnapshotReport* WorkerService::Snapshotted(const std::string& operation_id,
                                                         int rank) {
  const std::string key = absl::StrCat(operation_id, "/", rank);
  for (const auto& [k, report] : snapshotted_) {
    if (k == key) return &report;
  }
  return nullptr;
}

absl::StatusOr<pb::OperationStatus> WorkerService::CallWaitOperation(
    const std::string& operation_id, absl::Duration wait) {
  ++coordinator_wait_calls_;
  pb::WaitOperationRequest request;
  request.set_operation_id(operation_id);
  request.set_timeout_ms(absl::ToInt64Milliseconds(std::max(absl::ZeroDuration(), wait)));
  pb::OperationStatus op;
  absl::Status s = FromGrpcStatus(
      link_->stub()->WaitOperation(
          link_->Context(absl::Milliseconds(request.timeout_ms()) + link_->options().rpc_timeout)
              .get(),
          request, &op),
      CoordinatorCall("WaitOperation"));
  if (!s.ok()) return s;
  return op;
}

bool WorkerService::WaitOnWorkStream(const std::string& operation_id, absl::Time deadline,
                                     uint64_t epoch, pb::OperationStatus* op) {
  OperationEnds& ends = link_->operation_ends();
  while (link_->LeaseStatus(epoch).ok()) {
    // Woken each second to re-check the lease: a host cut off asks the coordinator, which
    // then says so (WaitAtCoordinator), within a second of its lease running out.
    const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(1));
    switch (ends.Wait(operation_id, until, op)) {
      case OperationEnds::Outcome::kEnded:
        return true;
      case OperationEnds::Outcome::kNotWatched:
        return false;
      case OperationEnds::Outcome::kNotEndedBy:
        if (absl::Now() >= deadline) return false;
        break;
    }
  }
  return false;
}

absl::Status WorkerService::WaitAtCoordinator(const std::string& operation_id, absl::Duration wait,
                                              uint64_t epoch, pb::OperationStatus* op,
                                              bool* cut_off) {
  *cut_off = false;
  // Whether this worker's lease had already run out before the call: only then does a call
  // that gets no answer show the host cut off (one in flight while the worker was frozen, or
  // when the link went down, is asked again).
  const absl::Status lease_before = link_->LeaseStatus(epoch);
  // At most a lease per call (none once the lease ran out): a worker cut off from the
  // coordinator notices within about a lease plus two RPC deadlines, not after the trainer's
  // whole wait.
  const absl::Duration lease = link_->lease();
  if (!lease_before.ok()) wait = absl::ZeroDuration();
  if (lease > absl::ZeroDuration()) wait = std::min(wait, lease);
  std::optional<absl::StatusOr<pb::OperationStatus>> result;
  if (wait > absl::ZeroDuration()) {
    // Only waits under a live lease share a call, so a shared call's silence never shows a host
    // cut off (none of its waiters would have concluded that from its own call either); zero
    // waits (lease run out, until_snapshot polls) make their own call. A waiter whose own wait
    // ends before the shared call returns asks once more with zero wait, for a current answer.
    result = coordinator_waits_.Wait(absl::StrCat(epoch, "/", operation_id), absl::Now() + wait,
                                     [&] { return CallWaitOperation(operation_id, wait); });
  }
  if (!result.has_value()) result = CallWaitOperation(operation_id, absl::ZeroDuration());
  absl::Status s = result->status();
  if (s.ok()) *op = **result;
  // A refused connection is a coordinator restarting (its successor answers for the
  // operation); silence past the lease is a host cut off or a coordinator frozen past every
  // lease: either way the coordinator aborts the operation.
  if (s.code() != absl::StatusCode::kDeadlineExceeded || lease_before.ok()) return s;
  *cut_off = true;
  return absl::UnavailableError(
      absl::StrCat(s.message(), "; host ", host_, " is cut off: ", lease_before.message()));
}

grpc::Status WorkerService::Wait(grpc::ServerContext* context, const pb::WaitRequest* request,
                                 pb::WaitResponse* response) {
  if (request->timeout_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("Wait: negative timeout_ms"));
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(request->timeout_ms());
  absl::StatusOr<SessionInfo> session = CallerSession(*context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  const int rank = request->until_snapshot() ? session->trainer.rank : -1;
  const uint64_t epoch = link_->registration_epoch();
  while (true) {
    bool snapshotted = false;
    pb::SaveSnapshotReport report;
    absl::Duration slice = std::min(absl::Milliseconds(100), deadline - absl::Now());
    if (slice < absl::ZeroDuration()) slice = absl::ZeroDuration();
    if (rank >= 0) {
      // Wait here for the snapshot, checking the operation's end at the coordinator between.
      std::lock_guard<std::mutex> lock(snapshot_mu_);
      absl::Time until = absl::Now() + slice;
      while (Snapshotted(request->operation_id(), rank) == nullptr &&
             !(snapshot_cv_.wait_until(snapshot_mu_, absl::ToChronoTime(until)) ==
               std::cv_status::timeout)) {
      }
      const pb::SaveSnapshotReport* r = Snapshotted(request->operation_id(), rank);
      snapshotted = r != nullptr;
      if (r != nullptr) report = *r;
    }
    if (rank >= 0 && !snapshotted && absl::Now() < deadline && !context->IsCancelled() &&
        link_->operation_ends().KnownOngoing(request->operation_id()) &&
        link_->LeaseStatus(epoch).ok()) {
      continue;  // not ended (the work stream would have said): no call until there is news
    }
    pb::OperationStatus op;
    bool cut_off = false;
    absl::Status s =
        rank < 0 && WaitOnWorkStream(request->operation_id(), deadline, epoch, &op)
            ? absl::OkStatus()
            : WaitAtCoordinator(request->operation_id(),
                                rank >= 0 ? absl::ZeroDuration() : deadline - absl::Now(), epoch,
                                &op, &cut_off);
    if ((s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded) &&
        !cut_off && absl::Now() < deadline && !context->IsCancelled()) {
      // The coordinator is away (restarting, stalled): ask again, so the trainer hears what
      // became of its operation (e.g. that a restarted coordinator does not know it) once it
      // is back.
      absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
      continue;
    }
    if (cut_off) {
      // The coordinator has declared this worker dead and aborted the operation: nothing may
      // write the trainer's memory any more.
      CloseGate(request->operation_id(), s);
    }
    if (!s.ok()) return ToGrpcStatus(s);
    const bool final = IsFinal(op.phase());
    if (final) {
      // Before the trainer hears that its operation ended, make sure no part on this worker
      // writes its memory any more (an aborted part may still be inside a chunk).
      CloseGate(request->operation_id(),
                op.phase() == pb::PHASE_DONE
                    ? absl::CancelledError("the operation is done")
                    : absl::Status(static_cast<absl::StatusCode>(op.status().code()),
                                   op.status().message()));
    }
    if (snapshotted || final || absl::Now() >= deadline || context->IsCancelled()) {
      response->set_phase(op.phase());
      response->set_code(op.status().code());
      response->set_message(op.status().message());
      response->set_bytes_done(op.bytes_done());
      response->set_bytes_total(op.bytes_total());
      response->set_received_version(op.received_version());
      response->set_snapshotted(snapshotted);
      if (snapshotted) *response->mutable_snapshot() = report;
      return grpc::Status::OK;
    }
  }
}

grpc::Status WorkerService::Goodbye(grpc::ServerContext* context, const pb::GoodbyeRequest* request,
                                    pb::GoodbyeResponse*) {
  absl::StatusOr<SessionInfo> session = CallerSession(*context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  absl::Status s = registry_->CloseSession(request->session_id());
  if (s.ok()) {
    spdlog::info("trainer_goodbye session={}", request->session_id());
    if (session.ok()) OnTrainerGone(*session);
  }
  return ToGrpcStatus(s);
}

void WorkerService::OnTrainerGone(const SessionInfo& session) {
  std::string worker_id = link_->worker_id();
  if (worker_id.empty()) return;  // not registered: the coordinator forgot us anyway
  if (registry_->SessionsOfRank(session.trainer.job, session.trainer.rank) > 0) {
    // A replacement trainer of this rank already said Hello here: the rank is attached through
    // it, and a detach now would drop it (and abort the operation it may have joined).
    spdlog::info("detach_skipped job={} rank={} (a newer trainer of the rank is connected)",
                 session.trainer.job, session.trainer.rank);
    return;
  }
  pb::DetachRankRequest request;
  request.set_job(session.trainer.job);
  request.set_rank(session.trainer.rank);
  request.set_worker_id(worker_id);
  pb::DetachRankResponse response;
  grpc::Status s = link_->stub()->DetachRank(link_->Context().get(), request, &response);
  if (!s.ok()) {
    spdlog::warn("detach_failed job={} rank={} error=\"{}\"", session.trainer.job,
                 session.trainer.rank, s.error_message());
  }
}

grpc::Status WorkerService::Status(grpc::ServerContext* context, const pb::WorkerStatusRequest*,
                                   pb::WorkerStatusResponse* response) {
  if (auto caller = Caller(*context); !caller.ok()) return ToGrpcStatus(caller.status());
  std::string id = link_->worker_id();
  response->set_worker_id(id);
  response->set_registered(!id.empty());
  response->set_coordinator_wait_calls(coordinator_wait_calls_);
  response->set_ends_from_stream(link_->operation_ends().ends_from_stream());
  for (const SessionInfo& s : registry_->Sessions()) {
    pb::TrainerSession* out = response->add_sessions();
    out->set_session_id(s.id);
    out->set_job(s.trainer.job);
    out->set_rank(s.trainer.rank);
    out->set_pid(s.trainer.pid);
    for (const std::string& seg : s.segments) out->add_segments(seg);
  }
  return grpc::Status::OK;
}

void WorkerService::OnRegistered(const std::string& worker_id) {
  for (const SessionInfo& s : registry_->Sessions()) {
    absl::Status attached = Attach(s, worker_id);
    if (!attached.ok()) {
      spdlog::warn("reattach_failed job={} rank={} error=\"{}\"", s.trainer.job, s.trainer.rank,
                   attached.ToString());
    }
  }
}

void WorkerService::OnWorkItem(const pb::WorkItem& item) {
  if (item.item_case() == pb::WorkItem::kPersist ||
      item.item_case() == pb::WorkItem::kPersistEnded ||
      item.item_case() == pb::WorkItem::kMemoryRecord) {
    if (persist_executor_ != nullptr) persist_executor_->Handle(item);  // its own thread
    return;
  }
  if (item.item_case() == pb::WorkItem::kAbort) {
    spdlog::warn("operation_aborted op={} job={} rank={} code={} cause=\"{}\"", item.operation_id(),
                 item.job(), item.rank(), item.abort().code(), item.abort().message());
    // Running parts stop at their next chunk; this returns once none is inside trainer memory.
    // An abort without a code is Aborted; an unknown code is Unknown, naming the number.
    absl::Status cause = FromDetail(item.abort());
    if (cause.ok()) cause = absl::AbortedError(item.abort().message());
    CloseGate(item.operation_id(), cause);
    return;
  }
  if (item.item_case() != pb::WorkItem::kPlanPart) return;
  std::shared_ptr<MemoryGate> gate = GateFor(item.operation_id());
  const std::string part_key = absl::StrCat(item.operation_id(), "/", item.rank());
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    // A work stream that was re-established resends the parts not reported yet; a part that
    // ran here must not run twice (a second communicator for one rank breaks the group).
    auto existing = parts_.find(part_key);
    if (existing != parts_.end()) {
      const bool finished = existing->second.finished;
      spdlog::info("plan_part_duplicate op={} rank={} ({})", item.operation_id(), item.rank(),
                   finished ? "already ran: its result is sent again" : "still running here");
      if (finished) {
        StartThreadLocked([this, part_key] { ReportUntilAcknowledged(part_key); });
      }
      return;
    }
    PartRecord& record = parts_[part_key];
    record.incarnation = item.incarnation();
    parts_order_.push_back(part_key);
    if (parts_order_.size() > 4096) {
      parts_.erase(parts_order_.front());
      parts_order_.pop_front();
    }
    // Each part runs on its own thread, so that aborts keep arriving meanwhile and the parts of
    // several jobs served by this worker run side by side.
    StartThreadLocked([this, item, gate]() mutable { Execute(std::move(item), *gate); });
  }
}

void WorkerService::StartThreadLocked(std::function<void()> body) {
  for (auto it = executors_.begin(); it != executors_.end();) {  // reap finished ones
    if (it->done->load()) {
      it->thread.join();
      it = executors_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  executors_.push_back(Executor{std::thread([body = std::move(body), done] {
                                  body();
                                  done->store(true);
                                }),
                                done});
}

std::shared_ptr<MemoryGate> WorkerService::GateFor(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(exec_mu_);
  for (auto& [id, gate] : gates_) {
    if (id == operation_id) return gate;
  }
  // Bound to the registration under which the operation's work arrived: once that
  // registration is lost (or its lease ran out unnoticed) the gate refuses.
  const uint64_t epoch = link_->registration_epoch();
  CoordinatorLink* link = link_;
  gates_.emplace_back(operation_id, std::make_shared<MemoryGate>(
                                        [link, epoch] { return link->LeaseStatus(epoch); }));
  std::shared_ptr<MemoryGate> gate = gates_.back().second;
  if (gates_.size() > 1024) {
    // Forget the oldest gate no running part holds (an abort must still find a held one).
    for (auto it = gates_.begin(); it != gates_.end(); ++it) {
      if (it->second.use_count() == 1) {
        gates_.erase(it);
        break;
      }
    }
  }
  return gate;
}

void WorkerService::CloseGate(const std::string& operation_id, const absl::Status& reason) {
  GateFor(operation_id)->Close(reason);  // outside exec_mu_: waits for accesses in progress
}

void WorkerService::OnLeaseLost(const absl::Status& why) {
  std::vector<std::shared_ptr<MemoryGate>> gates;
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    for (auto& [id, gate] : gates_) gates.push_back(gate);
  }
  for (const auto& gate : gates) gate->Close(why);
}

void WorkerService::Shutdown() {
  stopping_.Notify();
  OnLeaseLost(absl::CancelledError("the worker is shutting down"));
  std::list<Executor> executors;
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    executors.swap(executors_);
  }
  for (Executor& e : executors) e.thread.join();
}

void WorkerService::RegisterPartExecutor(pb::OperationKind kind,
                                         std::unique_ptr<PartExecutor> executor) {
  part_executors_[kind] = std::move(executor);
}

ProgressFn WorkerService::ProgressReporter(const pb::WorkItem& item) {
  auto last_report = std::make_shared<absl::Time>(absl::InfinitePast());
  return [this, last_report, operation_id = item.operation_id(),
          rank = item.rank()](int64_t bytes_done) {
    if (absl::Now() - *last_report < absl::Milliseconds(500)) return;
    *last_report = absl::Now();
    pb::ReportProgressRequest request;
    request.set_operation_id(operation_id);
    request.set_rank(rank);
    request.set_bytes_done(bytes_done);
    pb::ReportProgressResponse ignored;
    (void)link_->stub()->ReportProgress(link_->Context().get(), request, &ignored);
  };
}

PartOutcome WorkerService::RunPart(const pb::WorkItem& item, const SessionInfo* session,
                                   MemoryGate& gate, const ProgressFn& progress) {
  const std::string where = absl::StrCat("worker ", link_->worker_id(), " on host ", host_);
  PartOutcome out;
  auto found = part_executors_.find(item.kind());
  if (found == part_executors_.end()) {
    out.status = absl::InvalidArgumentError(absl::StrCat(
        where, " cannot execute plan parts of kind ", pb::OperationKind_Name(item.kind())));
    return out;
  }
  PartExecutor& executor = *found->second;
  if (executor.NeedsTrainer() && session == nullptr) {
    out.status = absl::FailedPreconditionError(absl::StrCat(where, ": the trainer of rank ",
                                                            item.rank(), " of job ", item.job(),
                                                            " is no longer connected"));
    return out;
  }
  out = executor.Execute(PartRun{item, session, gate, progress});
  if (!out.status.ok() && !executor.NeedsTrainer()) {
    // Errors of a part with a trainer name its rank and job; one without says which worker.
    out.status = absl::Status(out.status.code(), absl::StrCat(where, ": ", out.status.message()));
  }
  return out;
}

void WorkerService::RecordResult(const pb::WorkItem& item, PartOutcome out) {
  const std::string part_key = absl::StrCat(item.operation_id(), "/", item.rank());
  std::lock_guard<std::mutex> lock(exec_mu_);
  PartRecord& record = parts_[part_key];
  pb::ReportResultRequest& report = record.report;
  report.set_operation_id(item.operation_id());
  report.set_rank(item.rank());
  report.mutable_result()->set_code(static_cast<int32_t>(out.status.code()));
  report.mutable_result()->set_message(std::string(out.status.message()));
  report.set_written(std::move(out.written));
  report.set_bytes_read(out.bytes_read);
  record.incarnation = item.incarnation();
  record.finished = true;
}

void WorkerService::Execute(pb::WorkItem item, MemoryGate& gate) {
  if (absl::Status whole = kept_parts_.Resolve(item); !whole.ok()) {
    spdlog::warn("plan_part_unresolved op={} rank={} cause=\"{}\"", item.operation_id(),
                 item.rank(), std::string(whole.message()));
    PartOutcome refused;
    refused.status = whole;
    RecordResult(item, std::move(refused));
    ReportUntilAcknowledged(absl::StrCat(item.operation_id(), "/", item.rank()));
    return;
  }
  std::optional<SessionInfo> session;  // pins the trainer's mappings while the part runs
  for (SessionInfo& candidate : registry_->Sessions()) {
    if (candidate.trainer.job == item.job() && candidate.trainer.rank == item.rank()) {
      session = std::move(candidate);
    }
  }
  PartOutcome out =
      RunPart(item, session.has_value() ? &*session : nullptr, gate, ProgressReporter(item));
  session.reset();  // the trainer's memory is no longer needed
  RecordResult(item, std::move(out));
  ReportUntilAcknowledged(absl::StrCat(item.operation_id(), "/", item.rank()));
}

void WorkerService::ReportUntilAcknowledged(const std::string& part_key) {
  pb::ReportResultRequest report;
  uint64_t incarnation = 0;
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    auto it = parts_.find(part_key);
    // Sent even when an earlier report of it ended: a re-sent part asks for it again (and an
    // "already acknowledged" flag would race with that earlier report's ending).
    if (it == parts_.end() || !it->second.finished) return;
    report = it->second.report;
    incarnation = it->second.incarnation;
  }
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    pb::ReportResultResponse response;
    grpc::Status s = link_->stub()->ReportResult(link_->Context().get(), report, &response);
    const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                           s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    // A coordinator of another incarnation does not know the operation: no use sending.
    const uint64_t now_serving = link_->incarnation();
    const bool gone = now_serving != 0 && now_serving != incarnation;
    if (s.ok() || !transient || gone || stopping_.HasBeenNotified()) {
      spdlog::info("plan_part_result op={} rank={} code={} reported={} attempts={}{}",
                   report.operation_id(), report.rank(), report.result().code(), s.ok(), attempt,
                   s.ok() ? std::string()
                          : absl::StrCat(" error=\"", s.error_message(), "\"",
                                         gone ? " (the coordinator restarted)" : ""));
      return;
    }
    if (attempt == 1) {
      spdlog::warn("report_failed op={} rank={} error=\"{}\" (retrying until acknowledged)",
                   report.operation_id(), report.rank(), s.error_message());
    }
    if (stopping_.WaitForNotificationWithTimeout(backoff)) continue;  // one last attempt
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace ckpt::worker
