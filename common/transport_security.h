// How ckpt's daemons and tools protect their gRPC traffic, decided in one place (no gRPC here;
// common/grpc_auth turns the decision into gRPC credentials and reads callers' identities).
//
// Every party holds a certificate issued by the deployment's one CA (`ckptctl certs`). The
// certificate's role is a SAN URI "ckpt://role/<worker|operator|coordinator>"; its subject CN
// names the party. Coordinator certificates also carry the SAN DNS name "ckpt-coordinator",
// which every client checks instead of the host name it dialled.
//
// TLS is used whenever certificates are given. Without them a daemon may only listen on (and a
// client only dial) loopback, unless it is told --insecure (it then warns loudly).
#ifndef CKPT_COMMON_TRANSPORT_SECURITY_H_
#define CKPT_COMMON_TRANSPORT_SECURITY_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// What a certificate allows its holder to do.
enum class Role {
  kWorker,       // worker RPCs: register, heartbeat, work stream, joins, reports, rendezvous
  kOperator,     // operations: save, load, reshard, status, deregister a worker
  kCoordinator,  // serves the coordinator (no calls as a client)
};

// "worker", "operator", "coordinator".
absl::string_view RoleName(Role role);
// The role from its name; nullopt for anything else.
std::optional<Role> RoleFromName(absl::string_view name);
// "ckpt://role/<name>": the SAN URI that grants `role`.
std::string RoleUri(Role role);
// The role a SAN URI grants; nullopt when the URI is not a ckpt role.
std::optional<Role> RoleFromUri(absl::string_view uri);

// The SAN DNS name of every coordinator certificate; clients verify the server against it.
inline constexpr char kCoordinatorServerName[] = "ckpt-coordinator";

// Paths of one party's PEM files: the CA certificate, its own certificate and private key.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

// The transport a daemon or tool uses.
struct TransportSecurity {
  bool tls = false;
  // PEM contents (tls only).
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // Plaintext on an address reachable from other machines (--insecure): callers warn loudly.
  bool insecure_beyond_loopback = false;
};

// The PEM text of the private key at `path` (`what` names it in errors, e.g. "CA private
// key"), read only when no other user may read it: FailedPrecondition naming the path and its
// mode when group or others have any permission (0640 included; the daemons refuse their own
// keys so), or when it cannot be read or holds no PEM block. The daemons' keys and `ckptctl
// certs issue`'s CA key go through this one check.
absl::StatusOr<std::string> ReadPrivateKeyPem(const std::string& path, absl::string_view what);

// Whether `address` ("host:port", "[v6]:port", "unix:/path") stays on this machine: unix
// sockets, 127.0.0.0/8, ::1 and "localhost". Host names and wildcard addresses do not.
bool IsLoopbackAddress(absl::string_view address);

// Decides the transport of `program` for `address` (what it listens on or dials, named by
// `address_flag` in messages, e.g. "--listen"): TLS when `files` are given (all three must be,
// and readable); plaintext on loopback; plaintext beyond loopback only with `insecure`.
// FailedPrecondition otherwise, saying how to make certificates.
absl::StatusOr<TransportSecurity> ResolveTransportSecurity(const TlsFiles& files, bool insecure,
                                                           absl::string_view address,
                                                           absl::string_view address_flag,
                                                           absl::string_view program);

// The warning a daemon logs when it runs plaintext beyond loopback.
std::string InsecureWarning(absl::string_view program, absl::string_view address);

}  // namespace ckpt

#endif  // CKPT_COMMON_TRANSPORT_SECURITY_H_
