// The worker's connection to the coordinator: registers (announcing host, pid, data-plane
// address, memory kinds, local rank and GPU), renews its lease with heartbeats, re-registers
// after the coordinator forgot it or restarted, and pulls work items over the WatchWork
// stream, noting the operation ends it brings (worker/operation_ends.h). Two background threads;
// every RPC carries a deadline (the stream is cancelled on Stop()).
//
// A coordinator restart is noticed at the first refused or mismatched call: the work stream
// breaks when the old process dies and is retried every 100 ms (the channel's reconnect
// backoff is capped at 1 s); the new process refuses the old worker id (ids carry the
// coordinator's incarnation), and any response of another incarnation counts the same. The
// link then forgets its registration (the lease-lost handler runs: every operation that ran
// under it was aborted or is gone) and registers again at once.
#ifndef CKPT_WORKER_COORDINATOR_LINK_H_
#define CKPT_WORKER_COORDINATOR_LINK_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport_security.h"
#include "proto/coordinator.grpc.pb.h"
#include "worker/operation_ends.h"

namespace ckpt::worker {

// Configuration of the link.
struct LinkOptions {
  std::string coordinator;     // host:port
  TransportSecurity security;  // TLS with this worker's certificate, or plaintext
  pb::WorkerInfo info;
  absl::Duration rpc_timeout = absl::Seconds(5);
};

// The link. See the file comment.
class CoordinatorLink {
 public:
  // Called with every work item the coordinator streams to this worker.
  using WorkHandler = std::function<void(const pb::WorkItem&)>;
  // Called (from the link's thread) after every successful (re-)registration.
  using RegisteredHandler = std::function<void(const std::string& worker_id)>;
  // Called (from a link thread) when the registration was lost: the coordinator declared this
  // worker dead or restarted, so every operation that ran here under it is aborted or gone.
  using LeaseLostHandler = std::function<void(const absl::Status& why)>;

  explicit CoordinatorLink(LinkOptions options);
  ~CoordinatorLink();

  void SetWorkHandler(WorkHandler handler) { work_handler_ = std::move(handler); }
  void SetRegisteredHandler(RegisteredHandler handler) { registered_handler_ = std::move(handler); }
  void SetLeaseLostHandler(LeaseLostHandler handler) { lease_lost_handler_ = std::move(handler); }
  // Takes the names of memory checkpoints evicted since its last call; every heartbeat sends
  // them (kept until a heartbeat is acknowledged). Set before Start().
  using EvictionSource = std::function<std::vector<std::string>()>;
  void SetEvictionSource(EvictionSource source) { eviction_source_ = std::move(source); }
  // Describes what the memory tier holds; every registration sends it, so that a restarted
  // coordinator rebuilds its memory catalog from the workers. Set before Start().
  using HeldMemorySource = std::function<std::vector<pb::HeldMemoryCheckpoint>()>;
  void SetHeldMemorySource(HeldMemorySource source) { held_source_ = std::move(source); }

  void Start();
  // Stops both threads; with `deregister`, tells the coordinator this worker is leaving.
  void Stop(bool deregister);

  // The current worker id; empty while not registered.
  std::string worker_id() const;
  // The coordinator incarnation of the current registration (0 while not registered).
  uint64_t incarnation() const;
  // Counts successful registrations; operations delivered under one registration end with it.
  uint64_t registration_epoch() const;
  // Waits until registered; Unavailable naming the coordinator and the last error otherwise.
  absl::Status WaitRegistered(absl::Duration timeout) const;
  // OK while registration `epoch` holds and its lease was renewed recently enough that the
  // coordinator cannot have declared this worker dead (the last acknowledged renewal was sent
  // less than 1.5 leases ago). Unavailable saying why otherwise, e.g. after the process was
  // stopped (SIGSTOP) past its lease: checked before every chunk written into trainer memory.
  absl::Status LeaseStatus(uint64_t epoch) const;
  // Forgets the registration `worker_id` (if still current) because the coordinator refused
  // it or answered under another incarnation; registers again at once.
  void ForgetRegistration(const std::string& worker_id, const absl::Status& why);
  // Asks the coordinator now (one Heartbeat, within rpc_timeout) whether it still knows the
  // registration `worker_id`; forgets it (and registers again at once) when it does not, e.g.
  // after the coordinator restarted and before this link noticed. True: still registered as
  // `worker_id`, or the coordinator could not be asked.
  bool ConfirmRegistration(const std::string& worker_id);

  // The operation ends the work stream brought, and whether a stream is open to bring them.
  OperationEnds& operation_ends() { return operation_ends_; }

  pb::Coordinator::Stub* stub() { return stub_.get(); }
  const LinkOptions& options() const { return options_; }
  // The lease the coordinator granted at the last registration.
  absl::Duration lease() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_;
  }
  // A client context whose deadline is now + `timeout` (default: rpc_timeout).
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::ZeroDuration()) const;

 private:
  void LeaseLoop();
  void WatchLoop();
  // One RegisterWorker call; false when it failed (backoff doubled).
  bool Register(absl::Duration* backoff, bool* warned);
  void SendHeartbeat(const std::string& id, absl::Duration lease);
  // Sleeps up to `d`; returns early (true) when `id` is no longer the registration; false
  // when stopping.
  bool SleepWhileRegisteredAs(const std::string& id, absl::Duration d);
  bool SleepUnlessStopped(absl::Duration d);

  LinkOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  WorkHandler work_handler_;
  RegisteredHandler registered_handler_;
  LeaseLostHandler lease_lost_handler_;
  EvictionSource eviction_source_;
  HeldMemorySource held_source_;
  std::vector<std::string> unsent_evictions_;  // only the lease thread touches it
  OperationEnds operation_ends_;

  mutable std::mutex mu_;
  mutable std::condition_variable_any cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  // When the last acknowledged registration or heartbeat was sent.
  absl::Time renewed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // When the registration was lost (for the re-registration latency in the log).
  absl::Time lost_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread lease_thread_;
  std::thread watch_thread_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_COORDINATOR_LINK_H_
