// The trainer-facing gRPC service of the worker daemon (ckpt.pb.Worker, on a unix socket):
// trainer sessions and their shared tensors, and save/load requests forwarded to the
// coordinator as operation joins carrying the rank's shard metadata. Plan parts arrive over the
// coordinator's work stream: save parts are written from the trainer's shared memory into the
// save's staging directory, load parts are read from the checkpoint into it, reshard parts
// (no trainer involved) read the source checkpoint and write the rank's files of the target.
//
// Every access of a plan part to its trainer's memory goes through the operation's MemoryGate.
// The gate closes (and drains) when the abort arrives on the work stream, before Wait tells a
// trainer its operation ended, and when the worker's registration is lost (its operations were
// aborted); a gate also refuses once the worker's lease has run out locally (a frozen worker
// that was resumed). So after a trainer heard "aborted", nothing writes its memory any more.
// A part's result is re-sent until the coordinator acknowledges it; a part re-sent by the
// coordinator after it already ran here is answered from its recorded result.
#ifndef CKPT_WORKER_WORKER_SERVICE_H_
#define CKPT_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/notification.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "worker/coordinator_joins.h"
#include "worker/coordinator_link.h"
#include "worker/coordinator_waits.h"
#include "worker/kept_plan_parts.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"
#include "worker/memory_tier.h"
#include "worker/part_executor.h"
#include "worker/part_executors.h"
#include "worker/persist_executor.h"
#include "worker/staging_pipeline.h"
#include "worker/trainer_socket.h"

namespace ckpt::worker {

// The service. Thread-safe.
class WorkerService final : public pb::Worker::Service {
 public:
  // How long a call to join an operation waits for the job's other ranks on this worker to
  // join too, so that they go in one call (CoordinatorJoins).
  static constexpr absl::Duration kDefaultJoinLinger = absl::Milliseconds(50);

  // `registry`, `link` and `device_staging` must outlive the service. `device_staging` is the
  // pinned pool device tensors are staged through (null: this worker serves no GPU and refuses
  // device pieces).
  WorkerService(MemoryRegistry* registry, CoordinatorLink* link, std::string host,
                PinnedStagingPool* device_staging = nullptr,
                absl::Duration join_linger = kDefaultJoinLinger);

  // Nice increment of the Gloo event-loop thread of each load's communicator (default 10;
  // GlooOptions::loop_thread_nice says why). Call before serving.
  void set_gloo_loop_thread_nice(int nice) { gloo_loop_thread_nice_ = nice; }
  // The socket the trainers' calls arrive on: who called is asked of it (SO_PEERCRED), never
  // taken from the request. Required before serving; must outlive the service.
  void set_trainer_socket(const TrainerSocket* socket) { trainer_socket_ = socket; }
  // The memory tier mem:// saves keep their files in and mem:// loads read from (null, the
  // default: such parts fail naming the checkpoint). Call before serving; must outlive it.
  void set_memory_tier(MemoryTier* tier) { memory_tier_ = tier; }
  // The host pool storage saves copy into and write from, pipelined (null, the default: each
  // save copies into buffers of its own). Call before serving; must outlive the service.
  void set_host_pool(HostBufferPool* pool, bool direct_io) {
    host_save_.pool = pool;
    host_save_.direct_io = direct_io;
  }
  // Where saves to a store URL stage their files before the upload, and how long one rank's
  // upload may take (worker/object_upload.h). Call before serving.
  void set_object_uploads(std::string scratch_dir, absl::Duration timeout) {
    host_save_.object_scratch_dir = std::move(scratch_dir);
    host_save_.object_upload_timeout = timeout;
  }
  // Where PersistWork / PersistEnded items of the work stream go (null: ignored). Call
  // before serving; must outlive the service.
  void set_persist_executor(PersistExecutor* executor) { persist_executor_ = executor; }
  // The executor of plan parts of `kind`, replacing the default (the constructor registers
  // save, load and reshard). Call before serving.
  void RegisterPartExecutor(pb::OperationKind kind, std::unique_ptr<PartExecutor> executor);

  grpc::Status Hello(grpc::ServerContext* context, const pb::TrainerHello* request,
                     pb::TrainerHelloResponse* response) override;
  grpc::Status RegisterTensors(grpc::ServerContext* context,
                               const pb::RegisterTensorsRequest* request,
                               pb::RegisterTensorsResponse* response) override;
  grpc::Status Save(grpc::ServerContext* context, const pb::TransferRequest* request,
                    pb::TransferResponse* response) override;
  grpc::Status Load(grpc::ServerContext* context, const pb::TransferRequest* request,
                    pb::TransferResponse* response) override;
  grpc::Status Poll(grpc::ServerContext* context, const pb::PollRequest* request,
                    pb::PollResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const pb::WaitRequest* request,
                    pb::WaitResponse* response) override;
  grpc::Status Goodbye(grpc::ServerContext* context, const pb::GoodbyeRequest* request,
                       pb::GoodbyeResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const pb::WorkerStatusRequest* request,
                      pb::WorkerStatusResponse* response) override;

  // Re-attaches every session's rank after the link (re-)registered.
  void OnRegistered(const std::string& worker_id);
  // Tells the coordinator that a trainer's session ended (Goodbye or the process died).
  void OnTrainerGone(const SessionInfo& session);
  // Handles one item of the coordinator's work stream: a plan part starts running on its own
  // thread; an abort cancels the operation's running parts.
  void OnWorkItem(const pb::WorkItem& item);
  // The registration was lost: every operation that ran under it was aborted or is gone, so
  // every gate closes with `why`.
  void OnLeaseLost(const absl::Status& why);
  // Cancels running parts and waits for them (call after the link stopped).
  void Shutdown();

 private:
  grpc::Status Transfer(const pb::TransferRequest& request, pb::OperationKind kind,
                        pb::TransferResponse* response);
  absl::Status Attach(const SessionInfo& session, const std::string& worker_id);
  // The kernel's credentials of the trainer behind a call (PermissionDenied for another uid).
  absl::StatusOr<TrainerCredentials> Caller(const grpc::ServerContext& context) const;
  // The session `session_id` when the caller may use it (it opened it, by uid).
  absl::StatusOr<SessionInfo> CallerSession(const grpc::ServerContext& context,
                                            const std::string& session_id) const;

  // A plan part started here, and its result once it ran.
  struct PartRecord {
    bool finished = false;
    uint64_t incarnation = 0;  // of the coordinator that sent the part
    pb::ReportResultRequest report;
  };

  void StartThreadLocked(std::function<void()> body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // Runs a plan part (on its own thread; one sent by reference is first made whole from its
  // kept body), records its result and reports it.
  void Execute(pb::WorkItem item, MemoryGate& gate);
  // The registered executor of item.kind() run on the part; errors name this worker.
  PartOutcome RunPart(const pb::WorkItem& item, const SessionInfo* session, MemoryGate& gate,
                      const ProgressFn& progress);
  // Sends the part's progress to the coordinator at most twice a second.
  ProgressFn ProgressReporter(const pb::WorkItem& item);
  // Keeps the part's result for ReportUntilAcknowledged and for a re-sent part.
  void RecordResult(const pb::WorkItem& item, PartOutcome out);
  // Sends the part's result until the coordinator acknowledges it (or cannot take it any more:
  // the operation is unknown to it, it restarted, or this worker stops).
  void ReportUntilAcknowledged(const std::string& part_key);
  // The operation's gate, created open (bound to the current registration) on first use.
  std::shared_ptr<MemoryGate> GateFor(const std::string& operation_id);
  void CloseGate(const std::string& operation_id, const absl::Status& reason);
  void MarkSnapshotted(const std::string& operation_id, int rank,
                       const pb::SaveSnapshotReport& report);
  // The report of the part's snapshot; null when it is not snapshotted (yet).
  const pb::SaveSnapshotReport* Snapshotted(const std::string& operation_id, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_);

  // "<call> from host <host> to coordinator <address>": what a trainer's error says when
  // the coordinator cannot be reached from this host (a cut link names the host it cut off).
  std::string CoordinatorCall(absl::string_view call) const;
  // One WaitOperation call for `operation_id` waiting up to `wait` (no deadline beyond it).
  absl::StatusOr<pb::OperationStatus> CallWaitOperation(const std::string& operation_id,
                                                        absl::Duration wait);
  // Waits for the operation's end on the work stream (worker/operation_ends.h) until
  // `deadline`, while a stream that watches it is open and registration `epoch`'s lease holds:
  // true with `op` filled in once it ended; false to ask the coordinator.
  bool WaitOnWorkStream(const std::string& operation_id, absl::Time deadline, uint64_t epoch,
                        pb::OperationStatus* op);
  // The operation's status after waiting up to `wait` (at most a lease) at the coordinator,
  // into `op`. Waits of several trainers on one operation share one WaitOperation call
  // (coordinator_waits_). When this worker's lease (registration `epoch`) had run out before
  // the call and the coordinator does not answer it either, sets `cut_off` and returns
  // Unavailable naming this host: the coordinator has declared the worker dead and aborted
  // the operation.
  absl::Status WaitAtCoordinator(const std::string& operation_id, absl::Duration wait,
                                 uint64_t epoch, pb::OperationStatus* op, bool* cut_off);
  // JoinOperation with `join`'s full state, or only its digest when this worker joined the
  // same job and rank with the same description before; if the coordinator does not keep that
  // description (it restarted, the rank detached, ...) the full state follows transparently.
  // A changed description without compact tensors goes by reference to its layout class
  // (JoinOperationRequest.piece_list), in full when the coordinator asks (`*by_class`: it went
  // by reference and was taken so).
  absl::Status JoinSendingDigest(pb::JoinOperationRequest& join, pb::JoinOperationResponse* joined,
                                 bool* by_class = nullptr);
  // One JoinOperation through coordinator_joins_ (with the joins of this worker's other
  // trainers that arrive meanwhile); errors say which call to which coordinator failed.
  absl::Status JoinCoalesced(const pb::JoinOperationRequest& join,
                             pb::JoinOperationResponse* joined);

  MemoryRegistry* registry_;
  CoordinatorLink* link_;
  std::string host_;
  int gloo_loop_thread_nice_ = 10;
  MemoryTier* memory_tier_ = nullptr;  // read by the executors through &memory_tier_
  HostSaveOptions host_save_;          // read by the save executor through &host_save_
  PersistExecutor* persist_executor_ = nullptr;
  const TrainerSocket* trainer_socket_ = nullptr;
  // One per operation kind; filled before serving, read-only after.
  std::map<pb::OperationKind, std::unique_ptr<PartExecutor>> part_executors_;
  // A plan part running on its own thread.
  struct Executor {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Notification stopping_;
  // By "<registration epoch>/<operation>": the WaitOperation call in flight for the trainers
  // waiting on that operation.
  CoordinatorWaits coordinator_waits_;
  std::atomic<int64_t> coordinator_wait_calls_{0};  // CallWaitOperation calls (Status says)
  // The trainers' joins, several per JoinOperations call when they arrive together.
  CoordinatorJoins coordinator_joins_;
  // Save plan part bodies kept for repeat saves (sent by reference, only their tails).
  KeptPlanParts kept_parts_;
  std::mutex exec_mu_;
  std::list<Executor> executors_ ABSL_GUARDED_BY(exec_mu_);
  // By "<operation>/<rank>": the plan parts started here (the newest 4096), oldest first.
  absl::flat_hash_map<std::string, PartRecord> parts_ ABSL_GUARDED_BY(exec_mu_);
  std::deque<std::string> parts_order_ ABSL_GUARDED_BY(exec_mu_);
  std::deque<std::pair<std::string, std::shared_ptr<MemoryGate>>> gates_
      ABSL_GUARDED_BY(exec_mu_);  // by operation: the newest 1024, and every one a part holds
  std::mutex digests_mu_;
  // (job, rank) -> digest of the description the coordinator said it kept (state_kept).
  std::map<std::pair<std::string, int>, std::string> joined_digests_ ABSL_GUARDED_BY(digests_mu_);
  std::mutex snapshot_mu_;
  std::condition_variable_any snapshot_cv_;
  // By "<op>/<rank>", recent: how each snapshot was taken.
  std::deque<std::pair<std::string, pb::SaveSnapshotReport>> snapshotted_
      ABSL_GUARDED_BY(snapshot_mu_);
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_WORKER_SERVICE_H_
