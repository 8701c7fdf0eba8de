// How ckptctl's cluster commands (status, save, load, reshard --coordinator) reach the
// coordinator: TLS with the operator's certificate (--tls-ca/--tls-cert/--tls-key, else the
// environment's CKPT_TLS_CA/CKPT_TLS_CERT/CKPT_TLS_KEY), or plaintext to a loopback address
// (beyond loopback only with --insecure).
#ifndef CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_
#define CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport_security.h"
#include "proto/coordinator.pb.h"
#include "tools/ckptctl/cli_args.h"

namespace ckpt::ckptctl {

// The TLS options of a command.
struct TlsFlags {
  TlsFiles files;
  bool insecure = false;
};

// The TLS flags of the cluster commands (--tls-ca F, --tls-cert F, --tls-key F, --insecure),
// for their flag tables.
const std::vector<FlagSpec>& TlsFlagSpecs();

// The TLS options given on a command line parsed with TlsFlagSpecs() in its table.
TlsFlags TlsFromArgs(const ParsedArgs& args);

// A channel to the coordinator at `address` for `command` (named in errors).
// FailedPrecondition, saying how to make certificates, for plaintext beyond loopback.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(
    const std::string& address, const TlsFlags& flags, const std::string& command,
    grpc::ChannelArguments args = grpc::ChannelArguments());

// Channel arguments for status answers: up to 1 GiB (many workers and operations exceed gRPC's
// 4 MB default).
grpc::ChannelArguments StatusChannelArguments();

// GetStatus over `channel` to the coordinator at `address` (only `job`'s entries when not
// empty) within `timeout`: every page, merged into one answer (a job's ranks or a memory
// checkpoint's replicas split over pages are joined again). Errors name the coordinator.
absl::StatusOr<pb::GetStatusResponse> FetchCoordinatorStatus(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    const std::string& job, absl::Duration timeout);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_COORDINATOR_CHANNEL_H_
