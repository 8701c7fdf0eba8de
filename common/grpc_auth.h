// gRPC side of transport security (see common/transport_security.h): credentials for servers
// and channels, and the one place that reads a caller's identity from grpc::AuthContext.
// Service shells call PeerOf(context) and RequireRole(...); identities never come from request
// fields.
#ifndef CKPT_COMMON_GRPC_AUTH_H_
#define CKPT_COMMON_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/transport_security.h"

namespace ckpt {

// Server credentials: TLS requiring a client certificate from the CA, or plaintext.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security);

// A channel to the coordinator: TLS with this party's certificate, checking that the server
// holds a coordinator certificate of the CA (SAN DNS kCoordinatorServerName), or plaintext.
// `args` may carry other settings (message sizes).
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, const TransportSecurity& security,
    grpc::ChannelArguments args = grpc::ChannelArguments());

// Who called: from the connection's verified certificate, never from the request.
struct Peer {
  // False on a plaintext server (loopback, or --insecure): there is no identity to check and
  // every call is allowed.
  bool authenticated = false;
  Role role = Role::kWorker;  // when authenticated
  std::string name;           // the certificate's subject CN (when authenticated)
  std::string address;        // the transport's peer address ("ipv4:10.0.0.7:51234")

  // "worker:host7" (role and name); "" when not authenticated. Names a worker's owner.
  std::string Principal() const;
  // "worker certificate 'host7' (ipv4:...)" or "unauthenticated caller ipv4:...".
  std::string Describe() const;
};

// The caller of the call behind `context`. PermissionDenied when the caller's certificate
// carries no ckpt role (or several).
absl::StatusOr<Peer> PeerOf(const grpc::ServerContextBase& context);

// OK when `peer` holds one of `roles` or is unauthenticated (plaintext server); otherwise
// PermissionDenied naming the caller, `call` and the roles allowed.
absl::Status RequireRole(const Peer& peer, std::initializer_list<Role> roles,
                         absl::string_view call);

// PeerOf and RequireRole together: the authorised peer, or why not.
absl::StatusOr<Peer> AuthorizeCall(const grpc::ServerContextBase& context,
                                   std::initializer_list<Role> roles, absl::string_view call);

}  // namespace ckpt

#endif  // CKPT_COMMON_GRPC_AUTH_H_
