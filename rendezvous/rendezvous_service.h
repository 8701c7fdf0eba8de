// The coordinator's rendezvous key-value service (ckpt.pb.Rendezvous) over a KvStore.
// Gloo's store and NCCL's unique ids go through it (see rendezvous/store.h for the client).
//
// Only workers may call it (a worker certificate on a TLS server). With an authorizer wired
// (the coordinator daemon), every key must lie in the group ("<kind>/<operation id>/...") of
// an operation in flight that the calling worker serves; the KvStore's limits bound what one
// group may hold, and the coordinator erases a group when its operation ends.
#ifndef CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
#define CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

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

// Get waits until every key exists, up to the request's timeout_ms and the client's own
// deadline (whichever is earlier), and stops early when the client cancels. Every method is
// a gRPC callback method (no synchronous pool): a waiting Get holds no thread (a reactor over
// KvStore::WaitAsync) and one thread of the service ends the waits at their deadlines.
class RendezvousService final : public pb::Rendezvous::CallbackService {
 public:
  // `store` must outlive the service. Without `authorizer` any key is accepted (tests and
  // benchmarks with a private store). The server must be shut down before the service is
  // destroyed.
  explicit RendezvousService(KvStore* store, RendezvousAuthorizer authorizer = nullptr);
  ~RendezvousService() override;

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const pb::KvSetRequest* request,
                                pb::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const pb::KvGetRequest* request,
                                pb::KvGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const pb::KvAddRequest* request,
                                pb::KvAddResponse* response) override;

 private:
  // The job of the keys' groups when the caller may use them all ("" without an authorizer).
  absl::StatusOr<std::string> Authorize(const grpc::ServerContextBase& context,
                                        absl::Span<const std::string> keys,
                                        absl::string_view call) const;

  // Ends the store's async waits at their deadlines until the service is destroyed.
  void ExpireWaits();

  KvStore* store_;
  RendezvousAuthorizer authorizer_;
  std::mutex mu_;
  std::condition_variable expiry_wake_;  // a wait with an earlier deadline, or stopping
  absl::Time expiry_sleeps_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread expiry_;
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
