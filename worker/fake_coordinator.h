// Test helper: a small coordinator peer for worker unit tests, a real ckpt.pb.Coordinator gRPC
// service on 127.0.0.1. It registers workers under its incarnation (refusing ids of another
// one with NOT_FOUND, as the real coordinator does), renews leases, streams the work items a
// test pushes, records the results reported to it, and answers the first ReportResult calls with
// errors a test scripts. Everything a test waits for is a condition with a deadline.
#ifndef CKPT_WORKER_FAKE_COORDINATOR_H_
#define CKPT_WORKER_FAKE_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt::worker {

class FakeCoordinator final : public pb::Coordinator::Service {
 public:
  explicit FakeCoordinator(uint64_t incarnation, int64_t lease_ms = 3000)
      : incarnation_(incarnation), lease_ms_(lease_ms) {}
  ~FakeCoordinator() override { Stop(); }

  // Serves on 127.0.0.1:port (0 picks a free port); returns the port.
  int Start(int port = 0);
  // Cancels open work streams and stops serving.
  void Stop();
  std::string address() const;

  // Streams `item` (its incarnation set to this coordinator's) to the registered worker.
  void Push(pb::WorkItem item);
  // Streams `item` as if sent by a coordinator of `incarnation`.
  void PushAsIncarnation(pb::WorkItem item, uint64_t incarnation);
  // The next `codes.size()` ReportResult calls fail with these codes (OK answers normally).
  void FailNextReports(std::vector<grpc::StatusCode> codes);
  // Heartbeats are answered `delay` after they arrive (an overloaded coordinator); each still
  // renews the lease, as the real coordinator's does when its handler runs.
  void DelayHeartbeats(absl::Duration delay);

  // Each waits until the count reaches `n`; false at the deadline.
  bool WaitForRegistrations(int n, absl::Duration timeout);
  bool WaitForReports(int n, absl::Duration timeout);   // acknowledged ones
  bool WaitForWatchers(int n, absl::Duration timeout);  // open work streams
  // Waits until the `nth` work stream ever opened is the only one open (an earlier one the
  // worker cancelled has ended), so that pushed items go to it.
  bool WaitForOnlyStream(int nth, absl::Duration timeout);
  bool WaitForReportCalls(int n, absl::Duration timeout);
  bool WaitForHeartbeats(int n, absl::Duration timeout);  // answered ones, in all
  int heartbeats() const;
  std::vector<pb::ReportResultRequest> acknowledged_reports() const;
  int report_calls() const;
  std::vector<std::string> registered_ids() const;

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const pb::RegisterWorkerRequest* request,
                              pb::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const pb::HeartbeatRequest* request,
                         pb::HeartbeatResponse* response) override;
  grpc::Status WatchWork(grpc::ServerContext* context, const pb::WatchWorkRequest* request,
                         grpc::ServerWriter<pb::WorkItem>* writer) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const pb::ReportProgressRequest* request,
                              pb::ReportProgressResponse* response) override;
  grpc::Status ReportResult(grpc::ServerContext* context, const pb::ReportResultRequest* request,
                            pb::ReportResultResponse* response) override;

 private:
  bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) const;
  bool KnowsLocked(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t incarnation_;
  const int64_t lease_ms_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> registered_ ABSL_GUARDED_BY(mu_);
  std::deque<pb::WorkItem> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::StatusCode> scripted_report_codes_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::ReportResultRequest> reports_ ABSL_GUARDED_BY(mu_);
  int report_calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_delay_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int watchers_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_FAKE_COORDINATOR_H_
