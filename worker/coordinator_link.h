// The worker's connection to the coordinator: registers (announcing host, pid, data-plane
// address, memory kinds, local rank and GPU), renews its lease with heartbeats, re-registers
// after the coordinator forgot it or restarted, and pulls work items over the WatchWork
// stream. Two background threads; every RPC carries a deadline (the stream is cancelled on
// Stop()).
#ifndef CKPT_WORKER_COORDINATOR_LINK_H_
#define CKPT_WORKER_COORDINATOR_LINK_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport_security.h"
#include "proto/coordinator.grpc.pb.h"

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

  explicit CoordinatorLink(LinkOptions options);
  ~CoordinatorLink();

  void SetWorkHandler(WorkHandler handler) { work_handler_ = std::move(handler); }
  void SetRegisteredHandler(RegisteredHandler handler) { registered_handler_ = std::move(handler); }

  void Start();
  // Stops both threads; with `deregister`, tells the coordinator this worker is leaving.
  void Stop(bool deregister);

  // The current worker id; empty while not registered.
  std::string worker_id() const;
  // Waits until registered; Unavailable naming the coordinator and the last error otherwise.
  absl::Status WaitRegistered(absl::Duration timeout) const;

  pb::Coordinator::Stub* stub() { return stub_.get(); }
  const LinkOptions& options() const { return options_; }
  // The lease the coordinator granted at the last registration.
  absl::Duration lease() const {
    absl::MutexLock lock(&mu_);
    return lease_;
  }
  // A client context whose deadline is now + `timeout` (default: rpc_timeout).
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::ZeroDuration()) const;

 private:
  void LeaseLoop();
  void WatchLoop();
  bool SleepUnlessStopped(absl::Duration d);

  LinkOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  WorkHandler work_handler_;
  RegisteredHandler registered_handler_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread lease_thread_;
  std::thread watch_thread_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_COORDINATOR_LINK_H_
