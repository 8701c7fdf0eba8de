// The coordinator service's wiring of background persistence (memory saves with persist_to,
// coordinator/persist_driver.h): validating the path a save asks for, queueing the
// persistence once the memory save committed, running its storage steps on the advancer
// thread (unlocked), taking the workers' ReportPersist calls, handing a lost worker's files to
// other holders, and forgetting the copies a worker evicted from its memory tier.
#include "absl/strings/str_cat.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/memory_path.h"
#include "coordinator/coordinator_service.h"
#include "spdlog/spdlog.h"

namespace ckpt::coordinator {

absl::StatusOr<std::string> CoordinatorService::PersistTarget(OperationKind kind,
                                                              const std::string& path,
                                                              const std::string& persist_to,
                                                              absl::string_view what) const {
  if (persist_to.empty()) return std::string();
  if (IsMemoryPath(persist_to)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": persist_to '", persist_to,
                     "' is a memory path; a memory checkpoint is persisted to storage (a "
                     "directory under the checkpoint roots)"));
  }
  if (kind != OperationKind::kSave || !IsMemoryPath(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": persist_to '", persist_to, "' is only for memory saves (mem://<name>), not a ",
        OperationKindName(kind), " of '", path, "' (a storage save is durable already)"));
  }
  if (persist_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": persist_to '", persist_to, "' refused: this coordinator does not persist"));
  }
  return CheckpointPath(persist_to, absl::StrCat(what, " persist_to"));
}

absl::StatusOr<std::string> CoordinatorService::JoinMemoryOptions(
    OperationKind kind, const std::string& path, const pb::JoinOperationRequest& request) const {
  const std::string who = absl::StrCat("job ", request.job(), " rank ", request.rank());
  if (request.has_memory_replicas() && request.memory_replicas() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": negative memory_replicas ", request.memory_replicas(), " for ", path));
  }
  return PersistTarget(kind, path, request.persist_to(), who);
}

void CoordinatorService::QueuePersist(const Operation& op) {
  if (persist_ == nullptr || op.persist_to.empty() || op.kind != OperationKind::kSave ||
      !IsMemoryPath(op.path)) {
    return;
  }
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (!name.ok()) return;
  persist_->Enqueue({*name, op.persist_to, op.persist_overwrite});
  spdlog::info("persist_queued checkpoint={} path={} overwrite={}", op.path, op.persist_to,
               op.persist_overwrite);
  PersistChanged(true);
}

void CoordinatorService::PersistChanged(bool changed) {
  if (!changed || persist_ == nullptr) return;
  persist_due_ = true;
  advance_wake_.notify_all();
  WakeWaiters(/*all=*/true);  // the streams pick up new PersistWork and PersistEnded items
}

void CoordinatorService::RunPersistSteps() {
  persist_due_ = false;
  mu_.unlock();  // staging directories are made, committed or discarded without the lock
  std::vector<std::string> lines = persist_->RunSteps();
  mu_.lock();
  for (const std::string& line : lines) {
    if (line.rfind("persist_failed", 0) == 0) {
      spdlog::error("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  }
  WakeWaiters(/*all=*/true);
}

void CoordinatorService::PersistWorkerLost(const std::string& worker_id, const std::string& why) {
  if (persist_ == nullptr) return;
  PersistChanged(persist_->WorkerFailed(
      worker_id, absl::UnavailableError(absl::StrCat("worker ", worker_id, " lost: ", why))));
}

void CoordinatorService::DropEvictedCopies(const std::string& worker_id,
                                           const pb::HeartbeatRequest& request) {
  if (memory_catalog_ == nullptr || request.evicted_memory_checkpoints().empty()) return;
  std::vector<std::string> names(request.evicted_memory_checkpoints().begin(),
                                 request.evicted_memory_checkpoints().end());
  for (const std::string& name : memory_catalog_->DropEvicted(worker_id, names)) {
    spdlog::info("memory_copies_evicted checkpoint=mem://{} worker={}", name, worker_id);
  }
}

grpc::Status CoordinatorService::DoReportPersist(const grpc::ServerContextBase* context,
                                                 const pb::PersistReportRequest* request) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "ReportPersist");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckPersistReport(*request); !s.ok()) return Refuse(s, *peer);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ActsForWorker(*peer, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  if (persist_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this coordinator does not persist"));
  }
  spdlog::info("persist_reported worker={} id={} files={} code={} bytes={}", request->worker_id(),
               request->persist_id(), request->files_size(), request->result().code(),
               request->bytes_written());
  PersistChanged(persist_->Report(request->worker_id(), *request));
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportPersist(grpc::CallbackServerContext* context,
                                                            const pb::PersistReportRequest* request,
                                                            pb::PersistReportResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(DoReportPersist(context, request));
  return reactor;
}

}  // namespace ckpt::coordinator
