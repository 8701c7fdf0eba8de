// Store client of the coordinator's ckpt.pb.Rendezvous service. gRPC headers stay in the .cc.
#ifndef CKPT_RENDEZVOUS_GRPC_STORE_H_
#define CKPT_RENDEZVOUS_GRPC_STORE_H_

#include <memory>
#include <string>

#include "common/transport_security.h"
#include "rendezvous/store.h"

namespace ckpt {

// Talks to a Rendezvous server at `address` ("host:port"). Calls wait for the channel to
// become ready (so ranks may start before the server). Get gives the server until the deadline
// to report missing keys and the transport 0.5 s more, so an unresponsive server is reported
// at most 0.5 s after the deadline.
class GrpcStore : public Store {
 public:
  // `security`: TLS with the caller's (worker) certificate, or plaintext (the default).
  explicit GrpcStore(const std::string& address,
                     const TransportSecurity& security = TransportSecurity());
  ~GrpcStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) override;

 private:
  struct Impl;
  std::string address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_GRPC_STORE_H_
