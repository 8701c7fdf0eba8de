#include "coordinator/rendezvous_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ckpt {

grpc::Status RendezvousService::Set(grpc::ServerContext* /*context*/,
                                    const pb::KvSetRequest* request,
                                    pb::KvSetResponse* /*response*/) {
  if (request->key().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError("rendezvous Set: empty key"));
  }
  store_->Set(request->key(), request->value());
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const pb::KvGetRequest* request,
                                    pb::KvGetResponse* response) {
  if (request->timeout_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("rendezvous Get: negative timeout_ms"));
  }
  absl::Time deadline = absl::Now() + absl::Milliseconds(request->timeout_ms());
  absl::Time client_deadline = absl::FromChrono(context->deadline());
  deadline = std::min(deadline, client_deadline);
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  auto values = store_->WaitAndGet(keys, deadline, [context] { return context->IsCancelled(); });
  if (!values.ok()) return ToGrpcStatus(values.status());
  for (std::string& v : *values) response->add_values(std::move(v));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Add(grpc::ServerContext* /*context*/,
                                    const pb::KvAddRequest* request, pb::KvAddResponse* response) {
  auto value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace ckpt
