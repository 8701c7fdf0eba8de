#include "worker/coordinator_link.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);

}  // namespace

CoordinatorLink::CoordinatorLink(LinkOptions options) : options_(std::move(options)) {
  // Plan parts and joins of ranks with many tensors easily exceed gRPC's 4 MB default.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  channel_ = MakeCoordinatorChannel(options_.coordinator, options_.security, args);
  stub_ = pb::Coordinator::NewStub(channel_);
}

CoordinatorLink::~CoordinatorLink() { Stop(/*deregister=*/false); }

std::unique_ptr<grpc::ClientContext> CoordinatorLink::Context(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (timeout <= absl::ZeroDuration()) timeout = options_.rpc_timeout;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

void CoordinatorLink::Start() {
  lease_thread_ = std::thread([this] { LeaseLoop(); });
  watch_thread_ = std::thread([this] { WatchLoop(); });
}

void CoordinatorLink::Stop(bool deregister) {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !lease_thread_.joinable()) return;
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
    cv_.SignalAll();
    id = worker_id_;
  }
  if (lease_thread_.joinable()) lease_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (deregister && !id.empty()) {
    pb::DeregisterWorkerRequest request;
    request.set_worker_id(id);
    pb::DeregisterWorkerResponse response;
    grpc::Status s = stub_->DeregisterWorker(Context().get(), request, &response);
    if (!s.ok()) spdlog::warn("deregister_failed worker={} error=\"{}\"", id, s.error_message());
  }
  absl::MutexLock lock(&mu_);
  worker_id_.clear();
}

std::string CoordinatorLink::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

absl::Status CoordinatorLink::WaitRegistered(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  absl::Time deadline = absl::Now() + timeout;
  while (worker_id_.empty() && !stopping_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!worker_id_.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this worker is not registered with the coordinator at ", options_.coordinator,
                   last_error_.empty() ? "" : absl::StrCat(" (last error: ", last_error_, ")")));
}

bool CoordinatorLink::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  absl::Time deadline = absl::Now() + d;
  while (!stopping_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return !stopping_;
}

void CoordinatorLink::LeaseLoop() {
  absl::Duration backoff = kMinBackoff;
  bool warned = false;
  while (true) {
    std::string id;
    absl::Duration lease;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      id = worker_id_;
      lease = lease_;
    }
    if (id.empty()) {
      pb::RegisterWorkerRequest request;
      *request.mutable_info() = options_.info;
      pb::RegisterWorkerResponse response;
      grpc::Status s = stub_->RegisterWorker(Context().get(), request, &response);
      if (s.ok()) {
        {
          absl::MutexLock lock(&mu_);
          worker_id_ = response.worker_id();
          lease_ = absl::Milliseconds(std::max<int64_t>(response.lease_ms(), 30));
          last_error_.clear();
          cv_.SignalAll();
        }
        spdlog::info("registered worker={} coordinator={} lease_ms={}", response.worker_id(),
                     options_.coordinator, response.lease_ms());
        backoff = kMinBackoff;
        warned = false;
        if (registered_handler_) registered_handler_(response.worker_id());
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        last_error_ = FromGrpcStatus(s, "RegisterWorker").ToString();
      }
      if (!warned) {
        spdlog::warn("register_failed coordinator={} error=\"{}\" (retrying)", options_.coordinator,
                     s.error_message());
        warned = true;
      }
      if (!SleepUnlessStopped(backoff)) return;
      backoff = std::min(backoff * 2, kMaxBackoff);
      continue;
    }
    // Renew three times per lease so that one lost heartbeat does not kill the lease.
    if (!SleepUnlessStopped(lease / 3)) return;
    pb::HeartbeatRequest request;
    request.set_worker_id(id);
    pb::HeartbeatResponse response;
    grpc::Status s = stub_->Heartbeat(Context(std::min(options_.rpc_timeout, lease / 2)).get(),
                                      request, &response);
    if (s.ok()) continue;
    if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
        s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      spdlog::warn("lease_lost worker={} error=\"{}\" (registering again)", id, s.error_message());
      absl::MutexLock lock(&mu_);
      worker_id_.clear();
      if (watch_context_ != nullptr) watch_context_->TryCancel();
    } else {
      spdlog::warn("heartbeat_failed worker={} error=\"{}\"", id, s.error_message());
      absl::MutexLock lock(&mu_);
      last_error_ = FromGrpcStatus(s, "Heartbeat").ToString();
    }
  }
}

void CoordinatorLink::WatchLoop() {
  while (true) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && worker_id_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      id = worker_id_;
    }
    grpc::ClientContext context;  // long-lived stream: ended by TryCancel on Stop/lease loss
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      watch_context_ = &context;
    }
    pb::WatchWorkRequest request;
    request.set_worker_id(id);
    std::unique_ptr<grpc::ClientReader<pb::WorkItem>> reader = stub_->WatchWork(&context, request);
    pb::WorkItem item;
    while (reader->Read(&item)) {
      if (work_handler_) work_handler_(item);
    }
    grpc::Status s = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
      if (stopping_) return;
    }
    spdlog::debug("watch_ended worker={} status=\"{}\"", id, s.error_message());
    if (!SleepUnlessStopped(kMinBackoff * 5)) return;
  }
}

}  // namespace ckpt::worker
