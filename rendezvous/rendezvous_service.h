// The coordinator's rendezvous key-value service (ckpt.pb.Rendezvous) over a KvStore.
// Gloo's store and NCCL's unique ids go through it (see rendezvous/store.h for the client).
//
// Only workers may call it (a worker certificate on a TLS server). With an authorizer wired
// (the coordinator daemon), every key must lie in the group ("<kind>/<operation id>/...") of
// an operation in flight that the calling worker serves; the KvStore's limits bound what one
// group may hold, and the coordinator erases a group when its operation ends.
#ifndef CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
#define CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_auth.h"
#include "proto/coordinator.grpc.pb.h"
#include "rendezvous/kv_store.h"

namespace ckpt {

// Whether `peer` may use the keys of `group` (KvGroupOf); returns the job the group belongs
// to (for messages), or why not.
using RendezvousAuthorizer =
    std::function<absl::StatusOr<std::string>(const Peer& peer, absl::string_view group)>;

// Get blocks until every key exists, up to the request's timeout_ms and the client's own
// deadline (whichever is earlier), and stops early when the client cancels.
class RendezvousService final : public pb::Rendezvous::Service {
 public:
  // `store` must outlive the service. Without `authorizer` any key is accepted (tests and
  // benchmarks with a private store).
  explicit RendezvousService(KvStore* store, RendezvousAuthorizer authorizer = nullptr)
      : store_(store), authorizer_(std::move(authorizer)) {}

  grpc::Status Set(grpc::ServerContext* context, const pb::KvSetRequest* request,
                   pb::KvSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const pb::KvGetRequest* request,
                   pb::KvGetResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context, const pb::KvAddRequest* request,
                   pb::KvAddResponse* response) override;

 private:
  // The job of the keys' groups when the caller may use them all ("" without an authorizer).
  absl::StatusOr<std::string> Authorize(const grpc::ServerContext& context,
                                        absl::Span<const std::string> keys,
                                        absl::string_view call) const;

  KvStore* store_;
  RendezvousAuthorizer authorizer_;
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
