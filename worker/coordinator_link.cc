#include "worker/coordinator_link.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
// How soon a broken work stream is opened again (it is how a restart is noticed first).
constexpr absl::Duration kWatchRetry = absl::Milliseconds(100);

std::string Hex(uint64_t incarnation) { return absl::StrFormat("%016x", incarnation); }

// Whether the coordinator refused the worker id itself (unknown under its incarnation, or
// declared dead): the worker must register again.
bool RefusesRegistration(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::NOT_FOUND ||
         s.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
}

// Why the coordinator's answer to a Heartbeat ends a registration made under `incarnation`:
// it refused the worker id, or it answered as another incarnation (it restarted). OK: the
// registration holds (or the coordinator could not be asked).
absl::Status HeartbeatEndsRegistration(const grpc::Status& s, const pb::HeartbeatResponse& response,
                                       uint64_t incarnation) {
  if (RefusesRegistration(s)) return FromGrpcStatus(s, "Heartbeat");
  if (s.ok() && response.incarnation() != incarnation) {
    return absl::UnavailableError(absl::StrCat("the coordinator answered as incarnation ",
                                               Hex(response.incarnation()), ", registered with ",
                                               Hex(incarnation)));
  }
  return absl::OkStatus();
}

}  // namespace

CoordinatorLink::CoordinatorLink(LinkOptions options) : options_(std::move(options)) {
  // Plan parts and joins of ranks with many tensors easily exceed gRPC's 4 MB default.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  // gRPC's reconnect backoff grows to 2 minutes while the coordinator is down; a restarted
  // coordinator must be found within a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !lease_thread_.joinable()) return;
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
    cv_.notify_all();
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
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_.clear();
}

std::string CoordinatorLink::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

uint64_t CoordinatorLink::incarnation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_.empty() ? 0 : incarnation_;
}

uint64_t CoordinatorLink::registration_epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

absl::Status CoordinatorLink::WaitRegistered(absl::Duration timeout) const {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Time deadline = absl::Now() + timeout;
  while (worker_id_.empty() && !stopping_) {
    if ((cv_.wait_until(mu_, absl::ToChronoTime(deadline)) == std::cv_status::timeout)) break;
  }
  if (!worker_id_.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this worker is not registered with the coordinator at ", options_.coordinator,
                   last_error_.empty() ? "" : absl::StrCat(" (last error: ", last_error_, ")")));
}

absl::Status CoordinatorLink::LeaseStatus(uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (worker_id_.empty() || epoch != epoch_) {
    return absl::UnavailableError(
        "this worker lost its registration with the coordinator (declared dead, or the "
        "coordinator restarted): the operations it ran were aborted");
  }
  const absl::Duration since = absl::Now() - renewed_;
  if (since > lease_ + lease_ / 2) {
    return absl::UnavailableError(absl::StrCat(
        "this worker's lease of ", absl::FormatDuration(lease_), " ran out (last renewed ",
        absl::FormatDuration(absl::Trunc(since, absl::Milliseconds(1))),
        " ago: was the worker stopped or cut off?); the coordinator has aborted its operations"));
  }
  return absl::OkStatus();
}

void CoordinatorLink::ForgetRegistration(const std::string& worker_id, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (worker_id.empty() || worker_id_ != worker_id) return;
    worker_id_.clear();
    lost_at_ = absl::Now();
    last_error_ = why.ToString();
    if (watch_context_ != nullptr) watch_context_->TryCancel();
    cv_.notify_all();
  }
  spdlog::warn("lease_lost worker={} error=\"{}\" (registering again)", worker_id,
               std::string(why.message()));
  if (lease_lost_handler_) lease_lost_handler_(why);
}

bool CoordinatorLink::ConfirmRegistration(const std::string& worker_id) {
  if (worker_id.empty()) return false;
  pb::HeartbeatRequest request;  // no evictions: those are the lease loop's to send
  request.set_worker_id(worker_id);
  pb::HeartbeatResponse response;
  grpc::Status s = stub_->Heartbeat(Context().get(), request, &response);
  absl::Status ended = HeartbeatEndsRegistration(s, response, incarnation());
  if (ended.ok()) return true;
  ForgetRegistration(worker_id, ended);
  return false;
}

bool CoordinatorLink::SleepUnlessStopped(absl::Duration d) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Time deadline = absl::Now() + d;
  while (!stopping_) {
    if ((cv_.wait_until(mu_, absl::ToChronoTime(deadline)) == std::cv_status::timeout)) break;
  }
  return !stopping_;
}

bool CoordinatorLink::SleepWhileRegisteredAs(const std::string& id, absl::Duration d) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Time deadline = absl::Now() + d;
  while (!stopping_ && worker_id_ == id) {
    if ((cv_.wait_until(mu_, absl::ToChronoTime(deadline)) == std::cv_status::timeout)) break;
  }
  return !stopping_;
}

bool CoordinatorLink::Register(absl::Duration* backoff, bool* warned) {
  pb::RegisterWorkerRequest request;
  *request.mutable_info() = options_.info;
  if (held_source_) {
    for (pb::HeldMemoryCheckpoint& held : held_source_()) {
      *request.add_memory_held() = std::move(held);
    }
  }
  pb::RegisterWorkerResponse response;
  const absl::Time sent = absl::Now();
  grpc::Status s = stub_->RegisterWorker(Context().get(), request, &response);
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = FromGrpcStatus(s, "RegisterWorker").ToString();
    }
    if (!*warned) {
      spdlog::warn("register_failed coordinator={} error=\"{}\" (retrying)", options_.coordinator,
                   s.error_message());
      *warned = true;
    }
    *backoff = std::min(*backoff * 2, kMaxBackoff);
    return false;
  }
  absl::Time lost_at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker_id_ = response.worker_id();
    incarnation_ = response.incarnation();
    ++epoch_;
    lease_ = absl::Milliseconds(std::max<int64_t>(response.lease_ms(), 30));
    renewed_ = sent;
    lost_at = lost_at_;
    last_error_.clear();
    cv_.notify_all();
  }
  spdlog::info("registered worker={} coordinator={} incarnation={} lease_ms={}{}",
               response.worker_id(), options_.coordinator, Hex(response.incarnation()),
               response.lease_ms(),
               lost_at == absl::InfinitePast()
                   ? std::string()
                   : absl::StrCat(" reregistered_after_ms=",
                                  absl::ToInt64Milliseconds(absl::Now() - lost_at)));
  *backoff = kMinBackoff;
  *warned = false;
  if (registered_handler_) registered_handler_(response.worker_id());
  return true;
}

void CoordinatorLink::SendHeartbeat(const std::string& id, absl::Duration lease) {
  pb::HeartbeatRequest request;
  request.set_worker_id(id);
  if (eviction_source_) {
    for (std::string& name : eviction_source_()) unsent_evictions_.push_back(std::move(name));
  }
  for (const std::string& name : unsent_evictions_) request.add_evicted_memory_checkpoints(name);
  pb::HeartbeatResponse response;
  const absl::Time sent = absl::Now();
  // A whole lease to answer: an overloaded coordinator answers late but still renews the lease
  // (and extends leases by its own lag), so an answer that comes in renews it here too (from
  // when it was sent). Cut at half a lease, late answers were dropped: the lease ran out on
  // this side alone, and the worker refused its operations while the coordinator kept it.
  const absl::Duration timeout = std::min(options_.rpc_timeout, lease);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));  // the coordinator reads its lag
  grpc::Status s = stub_->Heartbeat(Context(timeout).get(), request, &response);
  uint64_t mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine = incarnation_;
    if (s.ok() && worker_id_ == id && response.incarnation() == mine) renewed_ = sent;
  }
  if (s.ok()) unsent_evictions_.clear();  // the catalog has them
  if (absl::Status ended = HeartbeatEndsRegistration(s, response, mine); !ended.ok()) {
    ForgetRegistration(id, ended);
    return;
  }
  if (s.ok()) return;
  spdlog::warn("heartbeat_failed worker={} error=\"{}\"", id, s.error_message());
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = FromGrpcStatus(s, "Heartbeat").ToString();
}

void CoordinatorLink::LeaseLoop() {
  absl::Duration backoff = kMinBackoff;
  bool warned = false;
  std::string renewing;  // the registration the heartbeats below renew
  absl::Time last_sent;  // when its last heartbeat (or the registration) was sent
  while (true) {
    std::string id;
    absl::Duration lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      id = worker_id_;
      lease = lease_;
    }
    if (id.empty()) {
      if (!Register(&backoff, &warned) && !SleepUnlessStopped(backoff)) return;
      continue;
    }
    if (renewing != id) {
      renewing = id;
      last_sent = absl::Now();
    }
    // Renew three times per lease so that one lost heartbeat does not kill the lease, each a
    // third of a lease after the previous one was sent (one answered late does not put the
    // next one off); a refused call elsewhere (the work stream) wakes this loop to register
    // again at once.
    if (!SleepWhileRegisteredAs(id, last_sent + lease / 3 - absl::Now())) return;
    if (worker_id() != id) continue;
    last_sent = absl::Now();
    SendHeartbeat(id, lease);
  }
}

void CoordinatorLink::WatchLoop() {
  while (true) {
    std::string id;
    uint64_t incarnation;
    grpc::ClientContext context;  // long-lived stream: ended by TryCancel on Stop/lease loss
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!stopping_ && worker_id_.empty()) cv_.wait(mu_);
      if (stopping_) return;
      id = worker_id_;
      incarnation = incarnation_;
      watch_context_ = &context;
    }
    pb::WatchWorkRequest request;
    request.set_worker_id(id);
    std::unique_ptr<grpc::ClientReader<pb::WorkItem>> reader = stub_->WatchWork(&context, request);
    pb::WorkItem item;
    while (reader->Read(&item)) {
      if (item.incarnation() != incarnation) {
        ForgetRegistration(
            id, absl::UnavailableError(absl::StrCat("work arrived from coordinator incarnation ",
                                                    Hex(item.incarnation()), ", registered with ",
                                                    Hex(incarnation))));
        context.TryCancel();
        continue;  // drains until the cancelled stream ends
      }
      if (item.stream_opened()) operation_ends_.StreamOpened();
      if (item.has_ended()) operation_ends_.Ended(item.ended());
      for (const pb::WorkItem& more : item.batched()) {
        if (more.has_ended()) operation_ends_.Ended(more.ended());
      }
      if (work_handler_) {
        google::protobuf::RepeatedPtrField<pb::WorkItem> batched;
        batched.Swap(item.mutable_batched());
        work_handler_(item);
        for (const pb::WorkItem& more : batched) work_handler_(more);
      }
    }
    operation_ends_.StreamClosed();
    grpc::Status s = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_context_ = nullptr;
      if (stopping_) return;
    }
    spdlog::debug("watch_ended worker={} status=\"{}\"", id, s.error_message());
    if (RefusesRegistration(s)) ForgetRegistration(id, FromGrpcStatus(s, "WatchWork"));
    if (!SleepUnlessStopped(kWatchRetry)) return;
  }
}

}  // namespace ckpt::worker
