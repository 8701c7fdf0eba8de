#include "common/transport_security.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace ckpt {
namespace {

constexpr char kRoleUriPrefix[] = "ckpt://role/";

// The host part of "host:port", "[v6]:port" or a bare host.
std::string HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) {
    return std::string(address.substr(0, address.find(']')));
  }
  // More than one ':' and no brackets: a bare IPv6 address.
  if (address.find(':') != address.rfind(':')) return std::string(address);
  return std::string(address.substr(0, address.find(':')));
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what, bool secret) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the ", what, " ", path, ": ", std::strerror(errno)));
  }
  if (secret && (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the private key ", path, " is readable by other users (mode ",
                     absl::StrFormat("%04o", st.st_mode & 0777), "); run chmod 600 ", path));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read the ", what, " ", path));
  }
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", what, " ", path, " holds no PEM block"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<std::string> ReadPrivateKeyPem(const std::string& path, absl::string_view what) {
  return ReadPem(path, what, /*secret=*/true);
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kOperator:
      return "operator";
    case Role::kCoordinator:
      return "coordinator";
  }
  return "unknown";
}

std::optional<Role> RoleFromName(absl::string_view name) {
  for (Role role : {Role::kWorker, Role::kOperator, Role::kCoordinator}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

std::string RoleUri(Role role) { return absl::StrCat(kRoleUriPrefix, RoleName(role)); }

std::optional<Role> RoleFromUri(absl::string_view uri) {
  if (!absl::ConsumePrefix(&uri, kRoleUriPrefix)) return std::nullopt;
  return RoleFromName(uri);
}

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  absl::ConsumePrefix(&address, "ipv4:");
  absl::ConsumePrefix(&address, "ipv6:");
  const std::string host = absl::AsciiStrToLower(HostOf(address));
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string InsecureWarning(absl::string_view program, absl::string_view address) {
  return absl::StrCat(
      "INSECURE: ", program, " runs without TLS on ", address,
      ", which other machines can reach: anyone who reaches it can save, load (overwrite a "
      "trainer's weights) and reshard checkpoints. Give --tls_ca/--tls_cert/--tls_key "
      "(ckptctl certs) to authenticate callers.");
}

absl::StatusOr<TransportSecurity> ResolveTransportSecurity(const TlsFiles& files, bool insecure,
                                                           absl::string_view address,
                                                           absl::string_view address_flag,
                                                           absl::string_view program) {
  TransportSecurity security;
  if (!files.empty()) {
    if (files.ca.empty() || files.cert.empty() || files.key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(program, ": --tls_ca, --tls_cert and --tls_key go together; got ",
                       files.ca.empty() ? "" : "--tls_ca ", files.cert.empty() ? "" : "--tls_cert ",
                       files.key.empty() ? "" : "--tls_key ", "only"));
    }
    auto ca = ReadPem(files.ca, "CA certificate (--tls_ca)", false);
    if (!ca.ok()) return ca.status();
    auto cert = ReadPem(files.cert, "certificate (--tls_cert)", false);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(files.key, "private key (--tls_key)", true);
    if (!key.ok()) return key.status();
    security.tls = true;
    security.ca_pem = *std::move(ca);
    security.cert_pem = *std::move(cert);
    security.key_pem = *std::move(key);
    return security;
  }
  if (IsLoopbackAddress(address)) return security;
  if (insecure) {
    security.insecure_beyond_loopback = true;
    return security;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      program, ": ", address_flag, " ", address,
      " reaches beyond this machine and no certificates were given, so anyone who reaches it "
      "could save, load and reshard checkpoints. Make certificates (docs/services.md, "
      "Security):\n"
      "  ckptctl certs init --dir DIR\n"
      "  ckptctl certs issue --dir DIR --role coordinator|worker|operator --name NAME\n"
      "and pass --tls_ca DIR/ca.pem --tls_cert DIR/ROLE-NAME.pem --tls_key DIR/ROLE-NAME.key; "
      "or use a loopback address (127.0.0.1) on one machine; or pass --insecure to run without "
      "authentication."));
}

}  // namespace ckpt
