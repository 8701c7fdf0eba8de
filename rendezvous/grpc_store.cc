#include "rendezvous/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt {

struct GrpcStore::Impl {
  std::unique_ptr<pb::Rendezvous::Stub> stub;
};

namespace {

void PrepareContext(grpc::ClientContext* context, absl::Time deadline) {
  context->set_deadline(absl::ToChronoTime(deadline));
  context->set_wait_for_ready(true);
}

}  // namespace

GrpcStore::GrpcStore(const std::string& address, const TransportSecurity& security)
    : address_(address), impl_(new Impl) {
  impl_->stub = pb::Rendezvous::NewStub(MakeCoordinatorChannel(address, security));
}

GrpcStore::~GrpcStore() = default;

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value, absl::Time deadline) {
  grpc::ClientContext context;
  PrepareContext(&context, deadline);
  pb::KvSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  pb::KvSetResponse response;
  return FromGrpcStatus(impl_->stub->Set(&context, request, &response),
                        absl::StrCat("rendezvous Set '", key, "' at ", address_));
}

absl::StatusOr<std::vector<std::string>> GrpcStore::Get(absl::Span<const std::string> keys,
                                                        absl::Time deadline) {
  grpc::ClientContext context;
  // Give the server's own timeout a small head start so that it, not the transport, reports
  // which keys are missing.
  PrepareContext(&context, deadline + absl::Milliseconds(500));
  pb::KvGetRequest request;
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
  pb::KvGetResponse response;
  grpc::Status status = impl_->stub->Get(&context, request, &response);
  if (!status.ok()) {
    return FromGrpcStatus(status, absl::StrCat("rendezvous Get at ", address_));
  }
  if (response.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("rendezvous Get at ", address_, ": asked for ",
                                            keys.size(), " keys, got ", response.values_size(),
                                            " values"));
  }
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

absl::StatusOr<int64_t> GrpcStore::Add(absl::string_view key, int64_t delta, absl::Time deadline) {
  grpc::ClientContext context;
  PrepareContext(&context, deadline);
  pb::KvAddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  pb::KvAddResponse response;
  grpc::Status status = impl_->stub->Add(&context, request, &response);
  if (!status.ok()) {
    return FromGrpcStatus(status, absl::StrCat("rendezvous Add '", key, "' at ", address_));
  }
  return response.value();
}

}  // namespace ckpt
