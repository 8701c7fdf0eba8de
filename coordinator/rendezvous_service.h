// The coordinator's rendezvous key-value service (ckpt.pb.Rendezvous) over a KvStore.
// Gloo's store and NCCL's unique ids go through it (see exchange/store.h for the client).
#ifndef CKPT_COORDINATOR_RENDEZVOUS_SERVICE_H_
#define CKPT_COORDINATOR_RENDEZVOUS_SERVICE_H_

#include "coordinator/kv_store.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt {

// Get blocks until every key exists, up to the request's timeout_ms and the client's own
// deadline (whichever is earlier), and stops early when the client cancels.
class RendezvousService final : public pb::Rendezvous::Service {
 public:
  // `store` must outlive the service.
  explicit RendezvousService(KvStore* store) : store_(store) {}

  grpc::Status Set(grpc::ServerContext* context, const pb::KvSetRequest* request,
                   pb::KvSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const pb::KvGetRequest* request,
                   pb::KvGetResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context, const pb::KvAddRequest* request,
                   pb::KvAddResponse* response) override;

 private:
  KvStore* store_;
};

}  // namespace ckpt

#endif  // CKPT_COORDINATOR_RENDEZVOUS_SERVICE_H_
