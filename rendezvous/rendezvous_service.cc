#include "rendezvous/rendezvous_service.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ckpt {
namespace {

// Prefixes the job a refused or failed rendezvous call belongs to.
absl::Status ForJob(const absl::Status& status, const std::string& job) {
  if (status.ok() || job.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("rendezvous of job ", job, ": ", status.message()));
}

// One Get: finishes when the store's wait ends (values, deadline, or cancellation).
class GetReactor final : public grpc::ServerUnaryReactor {
 public:
  GetReactor(KvStore* store, pb::KvGetResponse* response) : store_(store), response_(response) {}

  // Starts the wait; `job` prefixes a failure.
  void Start(std::vector<std::string> keys, absl::Time deadline, std::string job) {
    job_ = std::move(job);
    wait_id_ = store_->WaitAsync(
        std::move(keys), deadline,
        [this](absl::StatusOr<std::vector<std::string>> values) { Done(std::move(values)); });
  }
  void OnCancel() override { store_->CancelWait(wait_id_); }
  void OnDone() override { delete this; }

 private:
  void Done(absl::StatusOr<std::vector<std::string>> values) {
    if (!values.ok()) {
      Finish(ToGrpcStatus(ForJob(values.status(), job_)));
      return;
    }
    for (std::string& v : *values) response_->add_values(std::move(v));
    Finish(grpc::Status::OK);
  }

  KvStore* const store_;
  pb::KvGetResponse* const response_;
  std::string job_;
  uint64_t wait_id_ = 0;
};

}  // namespace

RendezvousService::RendezvousService(KvStore* store, RendezvousAuthorizer authorizer)
    : store_(store), authorizer_(std::move(authorizer)) {
  expiry_ = std::thread([this] { ExpireWaits(); });
}

RendezvousService::~RendezvousService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  expiry_wake_.notify_all();
  expiry_.join();
}

void RendezvousService::ExpireWaits() {
  constexpr absl::Duration kLongestSleep = absl::Seconds(1);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Under mu_, so that a Get registered meanwhile either is seen here or wakes the sleep.
    const absl::Time now = absl::Now();
    const absl::Time next = std::min(store_->ExpireWaits(now), now + kLongestSleep);
    expiry_sleeps_until_ = next;
    expiry_wake_.wait_until(lock, absl::ToChronoTime(next));
    expiry_sleeps_until_ = absl::InfinitePast();
  }
}

absl::StatusOr<std::string> RendezvousService::Authorize(const grpc::ServerContextBase& context,
                                                         absl::Span<const std::string> keys,
                                                         absl::string_view call) const {
  absl::StatusOr<Peer> peer = AuthorizeCall(context, {Role::kWorker}, call);
  if (!peer.ok()) return peer.status();
  if (!authorizer_) return std::string();
  std::set<std::string> groups;
  for (const std::string& key : keys) {
    absl::string_view group = KvGroupOf(key);
    if (group.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous key '", key, "' names no operation (keys are <kind>/<operation id>/...)"));
    }
    groups.emplace(group);
  }
  std::string job;
  for (const std::string& group : groups) {
    absl::StatusOr<std::string> owner = authorizer_(*peer, group);
    if (!owner.ok()) return owner.status();
    job = *owner;
  }
  return job;
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* context,
                                                 const pb::KvSetRequest* request,
                                                 pb::KvSetResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->key().empty()) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError("rendezvous Set: empty key")));
    return reactor;
  }
  absl::StatusOr<std::string> job = Authorize(*context, {request->key()}, "Rendezvous.Set");
  reactor->Finish(ToGrpcStatus(
      job.ok() ? ForJob(store_->Set(request->key(), request->value()), *job) : job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* context,
                                                 const pb::KvGetRequest* request,
                                                 pb::KvGetResponse* response) {
  auto* reactor = new GetReactor(store_, response);
  if (request->timeout_ms() < 0) {
    reactor->Finish(
        ToGrpcStatus(absl::InvalidArgumentError("rendezvous Get: negative timeout_ms")));
    return reactor;
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::string> job = Authorize(*context, keys, "Rendezvous.Get");
  if (!job.ok()) {
    reactor->Finish(ToGrpcStatus(job.status()));
    return reactor;
  }
  absl::Time deadline = absl::Now() + absl::Milliseconds(request->timeout_ms());
  deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  reactor->Start(std::move(keys), deadline, *std::move(job));
  // The expiry thread ends the wait at its deadline; wake it if it would sleep past that.
  std::lock_guard<std::mutex> lock(mu_);
  if (deadline < expiry_sleeps_until_) expiry_wake_.notify_all();
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Add(grpc::CallbackServerContext* context,
                                                 const pb::KvAddRequest* request,
                                                 pb::KvAddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> job = Authorize(*context, {request->key()}, "Rendezvous.Add");
  if (!job.ok()) {
    reactor->Finish(ToGrpcStatus(job.status()));
    return reactor;
  }
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  reactor->Finish(ToGrpcStatus(value.ok() ? absl::OkStatus() : ForJob(value.status(), *job)));
  return reactor;
}

}  // namespace ckpt
