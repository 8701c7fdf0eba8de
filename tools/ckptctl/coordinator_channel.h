// How ckptctl's cluster commands (status, save, load, reshard --coordinator) reach the
// coordinator: TLS with the operator's certificate (--tls_ca/--tls_cert/--tls_key, else the
// environment's CKPT_TLS_CA/CKPT_TLS_CERT/CKPT_TLS_KEY), or plaintext to a loopback address
// (beyond loopback only with --insecure).
#ifndef CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_
#define CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport_security.h"

namespace ckpt::ckptctl {

// The TLS options of a command.
struct TlsFlags {
  TlsFiles files;
  bool insecure = false;
};

// Consumes the TLS option at args[*i] ("--tls_ca F", "--tls_cert F", "--tls_key F",
// "--insecure", or their "--x=F" forms), advancing *i past its value; false when args[*i] is
// none of them (or its value is missing).
bool ConsumeTlsFlag(const std::vector<std::string>& args, size_t* i, TlsFlags* flags);

// A channel to the coordinator at `address` for `command` (named in errors).
// FailedPrecondition, saying how to make certificates, for plaintext beyond loopback.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(
    const std::string& address, const TlsFlags& flags, const std::string& command,
    grpc::ChannelArguments args = grpc::ChannelArguments());

// The --help lines of the TLS options.
extern const char kTlsHelp[];

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_
