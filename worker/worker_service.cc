#include "worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"
#include "worker/load_exchange_executor.h"
#include "worker/load_executor.h"
#include "worker/reshard_executor.h"
#include "worker/save_executor.h"

namespace ckpt::worker {
namespace {

// How long Hello waits for the worker's first registration.
constexpr absl::Duration kRegistrationWait = absl::Seconds(5);

std::string PhaseName(pb::OperationPhase phase) {
  std::string name = pb::OperationPhase_Name(phase);
  if (name.rfind("PHASE_", 0) == 0) name = name.substr(6);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

WorkerService::WorkerService(MemoryRegistry* registry, CoordinatorLink* link, std::string host)
    : registry_(registry), link_(link), host_(std::move(host)) {}

absl::Status WorkerService::Attach(const SessionInfo& session, const std::string& worker_id) {
  pb::AttachRankRequest request;
  request.set_job(session.trainer.job);
  request.set_world_size(session.trainer.world_size);
  request.set_rank(session.trainer.rank);
  request.set_worker_id(worker_id);
  request.set_trainer_pid(session.trainer.pid);
  pb::AttachRankResponse response;
  return FromGrpcStatus(link_->stub()->AttachRank(link_->Context().get(), request, &response),
                        absl::StrCat("AttachRank at coordinator ", link_->options().coordinator));
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
    if (t.memory_kind() == "host") host_bytes += t.nbytes();
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
  join.set_load_algorithm(request.exchange_algorithm());
  join.set_load_memory_budget_bytes(request.memory_budget_bytes());
  pb::RankState* state = join.mutable_state();
  state->set_rank(session->trainer.rank);
  for (const RegisteredTensor& t : session->tensors) {
    *state->add_shards() = t.shard;
    *state->add_layouts() = t.layout;
    if (state->mesh_shape_size() == 0 && !t.mesh_shape.empty()) {
      state->mutable_mesh_shape()->Add(t.mesh_shape.begin(), t.mesh_shape.end());
    }
  }
  pb::JoinOperationResponse joined;
  absl::Status s =
      FromGrpcStatus(link_->stub()->JoinOperation(link_->Context().get(), join, &joined),
                     absl::StrCat("JoinOperation at coordinator ", link_->options().coordinator));
  if (!s.ok()) return ToGrpcStatus(s);
  spdlog::info("operation_joined op={} job={} rank={} kind={} path={} shards={}",
               joined.operation().id(), join.job(), join.rank(), pb::OperationKind_Name(kind),
               join.path(), state->shards_size());
  response->set_operation_id(joined.operation().id());
  return grpc::Status::OK;
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
  absl::Status s = FromGrpcStatus(
      link_->stub()->PendingOperation(link_->Context().get(), pending, &answer),
      absl::StrCat("PendingOperation at coordinator ", link_->options().coordinator));
  if (!s.ok()) return ToGrpcStatus(s);
  response->set_pending(answer.pending());
  if (answer.pending()) {
    response->set_operation_id(answer.operation_id());
    response->set_kind(answer.kind() == pb::OPERATION_LOAD ? "load" : "save");
    response->set_path(answer.path());
  }
  return grpc::Status::OK;
}

void WorkerService::MarkSnapshotted(const std::string& operation_id, int rank) {
  absl::MutexLock lock(&snapshot_mu_);
  snapshotted_.push_back(absl::StrCat(operation_id, "/", rank));
  if (snapshotted_.size() > 4096) snapshotted_.pop_front();
  snapshot_cv_.SignalAll();
}

bool WorkerService::Snapshotted(const std::string& operation_id, int rank) {
  const std::string key = absl::StrCat(operation_id, "/", rank);
  return std::find(snapshotted_.begin(), snapshotted_.end(), key) != snapshotted_.end();
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
  while (true) {
    bool snapshotted = false;
    absl::Duration slice = std::min(absl::Milliseconds(100), deadline - absl::Now());
    if (slice < absl::ZeroDuration()) slice = absl::ZeroDuration();
    if (rank >= 0) {
      // Wait here for the snapshot, checking the operation's end at the coordinator between.
      absl::MutexLock lock(&snapshot_mu_);
      absl::Time until = absl::Now() + slice;
      while (!Snapshotted(request->operation_id(), rank) &&
             !snapshot_cv_.WaitWithDeadline(&snapshot_mu_, until)) {
      }
      snapshotted = Snapshotted(request->operation_id(), rank);
    }
    pb::WaitOperationRequest wait;
    wait.set_operation_id(request->operation_id());
    wait.set_timeout_ms(rank >= 0 ? 0 : request->timeout_ms());
    pb::OperationStatus op;
    absl::Status s = FromGrpcStatus(
        link_->stub()->WaitOperation(
            link_->Context(absl::Milliseconds(wait.timeout_ms()) + link_->options().rpc_timeout)
                .get(),
            wait, &op),
        absl::StrCat("WaitOperation at coordinator ", link_->options().coordinator));
    if (!s.ok()) return ToGrpcStatus(s);
    bool final = op.phase() == pb::PHASE_DONE || op.phase() == pb::PHASE_ABORTED;
    if (rank < 0 || snapshotted || final || absl::Now() >= deadline || context->IsCancelled()) {
      response->set_phase(PhaseName(op.phase()));
      response->set_code(op.status().code());
      response->set_message(op.status().message());
      response->set_bytes_done(op.bytes_done());
      response->set_bytes_total(op.bytes_total());
      response->set_snapshotted(snapshotted);
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
  if (item.item_case() == pb::WorkItem::kAbort) {
    spdlog::warn("operation_aborted op={} job={} rank={} code={} cause=\"{}\"", item.operation_id(),
                 item.job(), item.rank(), item.abort().code(), item.abort().message());
    CancelFlag(item.operation_id())->store(true);  // running parts stop at their next step
    return;
  }
  if (item.item_case() != pb::WorkItem::kPlanPart) return;
  // Each part runs on its own thread, so that aborts keep arriving meanwhile and the parts of
  // several jobs served by this worker run side by side.
  std::shared_ptr<std::atomic<bool>> cancelled = CancelFlag(item.operation_id());
  absl::MutexLock lock(&exec_mu_);
  // A work stream that was re-established resends the parts not reported yet; a part already
  // running here must not run twice (a second communicator for one rank breaks the group).
  const std::string part_key = absl::StrCat(item.operation_id(), "/", item.rank());
  if (!started_parts_.insert(part_key).second) {
    spdlog::info("plan_part_duplicate op={} rank={} (already running or done here)",
                 item.operation_id(), item.rank());
    return;
  }
  started_order_.push_back(part_key);
  if (started_order_.size() > 4096) {
    started_parts_.erase(started_order_.front());
    started_order_.pop_front();
  }
  for (auto it = executors_.begin(); it != executors_.end();) {  // reap finished ones
    if (it->done->load()) {
      it->thread.join();
      it = executors_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  executors_.push_back(Executor{std::thread([this, item, cancelled, done] {
                                  Execute(item, *cancelled);
                                  done->store(true);
                                }),
                                done});
}

std::shared_ptr<std::atomic<bool>> WorkerService::CancelFlag(const std::string& operation_id) {
  absl::MutexLock lock(&exec_mu_);
  for (auto& [id, flag] : cancel_flags_) {
    if (id == operation_id) return flag;
  }
  cancel_flags_.emplace_back(operation_id, std::make_shared<std::atomic<bool>>(false));
  if (cancel_flags_.size() > 1024) cancel_flags_.pop_front();
  return cancel_flags_.back().second;
}

void WorkerService::Shutdown() {
  std::list<Executor> executors;
  {
    absl::MutexLock lock(&exec_mu_);
    for (auto& [id, flag] : cancel_flags_) flag->store(true);
    executors.swap(executors_);
  }
  for (Executor& e : executors) e.thread.join();
}

void WorkerService::Execute(const pb::WorkItem& item, const std::atomic<bool>& cancelled) {
  auto is_cancelled = [&cancelled] { return cancelled.load(); };
  std::string kind = pb::OperationKind_Name(item.kind());
  if (kind.rfind("OPERATION_", 0) == 0) kind = kind.substr(10);
  for (char& c : kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string where = absl::StrCat("worker ", link_->worker_id(), " on host ", host_);
  absl::Status result;
  std::string written;
  int64_t bytes_read = 0;
  std::optional<SessionInfo> session;
  for (SessionInfo& candidate : registry_->Sessions()) {
    if (candidate.trainer.job == item.job() && candidate.trainer.rank == item.rank()) {
      session = std::move(candidate);
    }
  }
  // Progress goes to the coordinator at most twice a second (and at the end).
  absl::Time last_report = absl::InfinitePast();
  auto report_progress = [&](int64_t bytes_done) {
    if (absl::Now() - last_report < absl::Milliseconds(500)) return;
    last_report = absl::Now();
    pb::ReportProgressRequest progress;
    progress.set_operation_id(item.operation_id());
    progress.set_rank(item.rank());
    progress.set_bytes_done(bytes_done);
    pb::ReportProgressResponse ignored;
    (void)link_->stub()->ReportProgress(link_->Context().get(), progress, &ignored);
  };
  const absl::Time start = absl::Now();
  pb::SavePlanPart save_part;
  pb::LoadPlanPart load_part;
  if (item.kind() == pb::OPERATION_RESHARD) {
    // No trainer: the worker reads the source checkpoint and writes the rank's files itself.
    pb::ReshardPlanPart part;
    ReshardPartStats stats;
    if (!part.ParseFromString(item.plan_part())) {
      result = absl::InvalidArgumentError(absl::StrCat(where, ": unreadable reshard plan part"));
    } else {
      absl::StatusOr<std::string> done =
          ExecuteReshardPart(part, report_progress, is_cancelled, &stats);
      if (done.ok()) {
        written = *std::move(done);
      } else {
        result =
            absl::Status(done.status().code(), absl::StrCat(where, ": ", done.status().message()));
      }
      bytes_read = stats.bytes_read;
    }
    spdlog::info(
        "reshard_part_done op={} rank={} bytes={} files={} pieces={} bytes_read={} read_s={:.3f} "
        "write_s={:.3f} seconds={:.3f} ok={}",
        item.operation_id(), item.rank(), part.total_bytes(), stats.files, stats.pieces,
        stats.bytes_read, stats.read_seconds, stats.write_seconds,
        absl::ToDoubleSeconds(absl::Now() - start), result.ok());
  } else if (!session.has_value()) {
    result = absl::FailedPreconditionError(absl::StrCat(where, ": the trainer of rank ",
                                                        item.rank(), " of job ", item.job(),
                                                        " is no longer connected"));
  } else if (item.kind() == pb::OPERATION_SAVE) {
    if (!save_part.ParseFromString(item.plan_part())) {
      result = absl::InvalidArgumentError(absl::StrCat(where, ": unreadable save plan part"));
    } else {
      // Copy out of the trainer's memory first; from then on the trainer may train on while
      // the copy is written.
      absl::StatusOr<SaveSnapshot> snapshot = SnapshotSavePart(save_part, *session);
      if (!snapshot.ok()) {
        result = snapshot.status();
      } else {
        MarkSnapshotted(item.operation_id(), item.rank());
        spdlog::info("save_part_snapshotted op={} rank={} bytes={} seconds={:.3f}",
                     item.operation_id(), item.rank(), save_part.total_bytes(),
                     absl::ToDoubleSeconds(absl::Now() - start));
        absl::StatusOr<std::string> done = WriteSnapshot(*snapshot, report_progress, is_cancelled);
        result = done.status();
        if (done.ok()) written = *std::move(done);
      }
    }
    spdlog::info("save_part_written op={} rank={} bytes={} files={} seconds={:.3f} ok={}",
                 item.operation_id(), item.rank(), save_part.total_bytes(), save_part.files_size(),
                 absl::ToDoubleSeconds(absl::Now() - start), result.ok());
  } else if (item.kind() == pb::OPERATION_LOAD) {
    if (!load_part.ParseFromString(item.plan_part())) {
      result = absl::InvalidArgumentError(absl::StrCat(where, ": unreadable load plan part"));
    } else if (load_part.algorithm().empty() || load_part.algorithm() == "direct") {
      result = ExecuteLoadPart(load_part, *session, report_progress, is_cancelled);
      if (result.ok()) bytes_read = load_part.total_bytes();
    } else {
      ExchangeLoadContext context;
      context.rendezvous_address = link_->options().coordinator;
      context.rendezvous_security = link_->options().security;
      context.hostname = link_->options().info.data_plane_address();
      if (context.hostname.empty()) context.hostname = host_;
      context.gloo_loop_thread_nice = gloo_loop_thread_nice_;
      ExchangeLoadStats stats;
      result = ExecuteExchangeLoadPart(load_part, *session, context, &stats, report_progress,
                                       is_cancelled);
      bytes_read = stats.bytes_read;
      if (!result.ok() && !cancelled.load()) {
        // A peer that died mid-exchange shows up here as a broken connection; the coordinator
        // notices the dead worker within its lease and aborts the operation naming it. Give it
        // that long, so every rank receives the root cause rather than this rank's symptom
        // (the coordinator keeps the first diagnosis; this result follows either way).
        const absl::Time until = absl::Now() + link_->lease() + absl::Seconds(1);
        while (!cancelled.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
      }
      spdlog::info(
          "load_part_exchanged op={} rank={} algorithm={} waves={} bytes_read={} bytes_sent={} "
          "bytes_received={} bytes_scattered={} rendezvous_s={:.3f} read_s={:.3f} "
          "exchange_s={:.3f} scatter_s={:.3f}",
          item.operation_id(), item.rank(), load_part.algorithm(), load_part.waves_size(),
          stats.bytes_read, stats.bytes_sent, stats.bytes_received, stats.bytes_scattered,
          absl::ToDoubleSeconds(stats.rendezvous_time), absl::ToDoubleSeconds(stats.read_time),
          absl::ToDoubleSeconds(stats.exchange_time), absl::ToDoubleSeconds(stats.scatter_time));
    }
    spdlog::info("load_part_done op={} rank={} bytes={} tensors={} seconds={:.3f} ok={}",
                 item.operation_id(), item.rank(), load_part.total_bytes(), load_part.reads_size(),
                 absl::ToDoubleSeconds(absl::Now() - start), result.ok());
  } else {
    result = absl::InvalidArgumentError(
        absl::StrCat(where, " cannot execute plan parts of kind ", kind));
  }
  pb::ReportResultRequest report;
  report.set_operation_id(item.operation_id());
  report.set_rank(item.rank());
  report.mutable_result()->set_code(static_cast<int32_t>(result.code()));
  report.mutable_result()->set_message(std::string(result.message()));
  report.set_written(written);
  report.set_bytes_read(bytes_read);
  pb::ReportResultResponse response;
  grpc::Status s = link_->stub()->ReportResult(link_->Context().get(), report, &response);
  spdlog::info("plan_part_result op={} rank={} code={} reported={}", item.operation_id(),
               item.rank(), static_cast<int>(result.code()), s.ok());
}

}  // namespace ckpt::worker
