#include "common/grpc_auth.h"

#include <grpc/grpc_security_constants.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportSecurity& security) {
  if (!security.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = security.ca_pem;
  options.pem_key_cert_pairs.push_back({security.key_pem, security.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address,
                                                      const TransportSecurity& security,
                                                      grpc::ChannelArguments args) {
  if (!security.tls) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.ca_pem;
  options.pem_private_key = security.key_pem;
  options.pem_cert_chain = security.cert_pem;
  // The server must prove it holds a coordinator certificate of our CA, whatever address it
  // was reached by (the CA issues that name to coordinators only).
  args.SetSslTargetNameOverride(kCoordinatorServerName);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

std::string Peer::Principal() const {
  if (!authenticated) return "";
  return absl::StrCat(RoleName(role), ":", name);
}

std::string Peer::Describe() const {
  if (!authenticated) return absl::StrCat("unauthenticated caller ", address);
  return absl::StrCat(RoleName(role), " certificate '", name, "' (", address, ")");
}

absl::StatusOr<Peer> PeerOf(const grpc::ServerContextBase& context) {
  Peer peer;
  peer.address = context.peer();
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return peer;
  std::vector<Role> roles;
  for (const grpc::string_ref& uri : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
    std::optional<Role> role = RoleFromUri(absl::string_view(uri.data(), uri.size()));
    if (role.has_value()) roles.push_back(*role);
  }
  std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  peer.name = cn.empty() ? "" : std::string(cn.front().data(), cn.front().size());
  if (roles.size() != 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("the certificate of '", peer.name, "' (", peer.address, ") carries ",
                     roles.empty() ? "no ckpt role" : "several ckpt roles",
                     "; issue one with `ckptctl certs issue --role worker|operator` (one SAN URI "
                     "ckpt://role/<role>)"));
  }
  peer.authenticated = true;
  peer.role = roles.front();
  return peer;
}

absl::Status RequireRole(const Peer& peer, std::initializer_list<Role> roles,
                         absl::string_view call) {
  if (!peer.authenticated) return absl::OkStatus();
  std::vector<std::string> names;
  for (Role role : roles) {
    if (peer.role == role) return absl::OkStatus();
    names.emplace_back(RoleName(role));
  }
  return absl::PermissionDeniedError(absl::StrCat(peer.Describe(), " may not call ", call,
                                                  "; it needs a certificate of role ",
                                                  absl::StrJoin(names, " or ")));
}

absl::StatusOr<Peer> AuthorizeCall(const grpc::ServerContextBase& context,
                                   std::initializer_list<Role> roles, absl::string_view call) {
  absl::StatusOr<Peer> peer = PeerOf(context);
  if (!peer.ok()) return peer.status();
  if (absl::Status s = RequireRole(*peer, roles, call); !s.ok()) return s;
  return peer;
}

}  // namespace ckpt
