#include "worker/fake_coordinator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckpt::worker {

int FakeCoordinator::Start(int port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  return server_ ? port_ : 0;
}

void FakeCoordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || server_ == nullptr) return;
    stopping_ = true;
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server_->Wait();
  server_.reset();  // closes the listening socket, so a successor can take the port
}

std::string FakeCoordinator::address() const { return absl::StrCat("127.0.0.1:", port_); }

void FakeCoordinator::Push(pb::WorkItem item) { PushAsIncarnation(std::move(item), incarnation_); }

void FakeCoordinator::PushAsIncarnation(pb::WorkItem item, uint64_t incarnation) {
  item.set_incarnation(incarnation);
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(item));
}

void FakeCoordinator::FailNextReports(std::vector<grpc::StatusCode> codes) {
  absl::MutexLock lock(&mu_);
  scripted_report_codes_.assign(codes.begin(), codes.end());
}

bool FakeCoordinator::WaitUntil(const std::function<bool()>& done, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done, &std::function<bool()>::operator()), timeout);
}

bool FakeCoordinator::WaitForRegistrations(int n, absl::Duration timeout) {
  return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return registered_.size() >= size_t(n); },
                   timeout);
}

bool FakeCoordinator::WaitForReports(int n, absl::Duration timeout) {
  return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return reports_.size() >= size_t(n); },
                   timeout);
}

bool FakeCoordinator::WaitForWatchers(int n, absl::Duration timeout) {
  return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return watchers_ >= n; }, timeout);
}

bool FakeCoordinator::WaitForOnlyStream(int nth, absl::Duration timeout) {
  return WaitUntil(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return streams_opened_ >= nth && watchers_ == 1; },
      timeout);
}

bool FakeCoordinator::WaitForReportCalls(int n, absl::Duration timeout) {
  return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return report_calls_ >= n; }, timeout);
}

std::vector<pb::ReportResultRequest> FakeCoordinator::acknowledged_reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

int FakeCoordinator::report_calls() const {
  absl::MutexLock lock(&mu_);
  return report_calls_;
}

std::vector<std::string> FakeCoordinator::registered_ids() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

bool FakeCoordinator::KnowsLocked(const std::string& worker_id) const {
  for (const std::string& id : registered_) {
    if (id == worker_id) return true;
  }
  return false;
}

grpc::Status FakeCoordinator::RegisterWorker(grpc::ServerContext*,
                                             const pb::RegisterWorkerRequest* request,
                                             pb::RegisterWorkerResponse* response) {
  absl::MutexLock lock(&mu_);
  std::string id = absl::StrCat(request->info().host(), "-", incarnation_, "-", registered_.size());
  registered_.push_back(id);
  response->set_worker_id(id);
  response->set_lease_ms(lease_ms_);
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* request,
                                        pb::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  if (!KnowsLocked(request->worker_id())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown worker ", request->worker_id()));
  }
  if (heartbeat_delay_ > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), heartbeat_delay_);
  }
  ++heartbeats_;
  response->set_lease_ms(lease_ms_);
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

void FakeCoordinator::DelayHeartbeats(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  heartbeat_delay_ = delay;
}

bool FakeCoordinator::WaitForHeartbeats(int n, absl::Duration timeout) {
  return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heartbeats_ >= n; }, timeout);
}

int FakeCoordinator::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

grpc::Status FakeCoordinator::WatchWork(grpc::ServerContext* context,
                                        const pb::WatchWorkRequest* request,
                                        grpc::ServerWriter<pb::WorkItem>* writer) {
  absl::MutexLock lock(&mu_);
  if (!KnowsLocked(request->worker_id())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown worker ", request->worker_id()));
  }
  ++watchers_;
  ++streams_opened_;
  auto has_work_or_stops = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return stopping_ || !pending_.empty();
  };
  // A stream lives until the worker cancels it or the server stops; the cancellation is
  // observed at most 50 ms late (gRPC offers no wake-up on it here).
  bool open = true;
  while (open && !context->IsCancelled()) {
    mu_.AwaitWithTimeout(absl::Condition(&has_work_or_stops), absl::Milliseconds(50));
    if (stopping_) break;
    while (open && !pending_.empty()) {
      pb::WorkItem item = std::move(pending_.front());
      pending_.pop_front();
      mu_.Unlock();
      bool written = writer->Write(item);
      mu_.Lock();
      if (!written) {  // the stream ended: the item waits for the next one
        pending_.push_front(std::move(item));
        open = false;
      }
    }
  }
  --watchers_;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the work stream ended");
}

grpc::Status FakeCoordinator::ReportProgress(grpc::ServerContext*, const pb::ReportProgressRequest*,
                                             pb::ReportProgressResponse*) {
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::ReportResult(grpc::ServerContext*,
                                           const pb::ReportResultRequest* request,
                                           pb::ReportResultResponse*) {
  absl::MutexLock lock(&mu_);
  ++report_calls_;
  if (!scripted_report_codes_.empty()) {
    grpc::StatusCode code = scripted_report_codes_.front();
    scripted_report_codes_.pop_front();
    if (code != grpc::StatusCode::OK) {
      return grpc::Status(code, absl::StrCat("scripted failure of report ", report_calls_));
    }
  }
  reports_.push_back(*request);
  return grpc::Status::OK;
}

}  // namespace ckpt::worker
