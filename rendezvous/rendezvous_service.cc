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

}  // namespace

absl::StatusOr<std::string> RendezvousService::Authorize(const grpc::ServerContext& context,
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

grpc::Status RendezvousService::Set(grpc::ServerContext* context, const pb::KvSetRequest* request,
                                    pb::KvSetResponse* /*response*/) {
  if (request->key().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError("rendezvous Set: empty key"));
  }
  absl::StatusOr<std::string> job = Authorize(*context, {request->key()}, "Rendezvous.Set");
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ForJob(store_->Set(request->key(), request->value()), *job));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const pb::KvGetRequest* request,
                                    pb::KvGetResponse* response) {
  if (request->timeout_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("rendezvous Get: negative timeout_ms"));
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::string> job = Authorize(*context, keys, "Rendezvous.Get");
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::Time deadline = absl::Now() + absl::Milliseconds(request->timeout_ms());
  absl::Time client_deadline = absl::FromChrono(context->deadline());
  deadline = std::min(deadline, client_deadline);
  auto values = store_->WaitAndGet(keys, deadline, [context] { return context->IsCancelled(); });
  if (!values.ok()) return ToGrpcStatus(ForJob(values.status(), *job));
  for (std::string& v : *values) response->add_values(std::move(v));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Add(grpc::ServerContext* context, const pb::KvAddRequest* request,
                                    pb::KvAddResponse* response) {
  absl::StatusOr<std::string> job = Authorize(*context, {request->key()}, "Rendezvous.Add");
  if (!job.ok()) return ToGrpcStatus(job.status());
  auto value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(ForJob(value.status(), *job));
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace ckpt
