#include "tools/ckptctl/coordinator_channel.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt::ckptctl {

const std::vector<FlagSpec>& TlsFlagSpecs() {
  static const std::vector<FlagSpec>* flags = new std::vector<FlagSpec>{
      {"tls-ca", "FILE", "the deployment's CA certificate (ckptctl certs; default $CKPT_TLS_CA)"},
      {"tls-cert", "FILE", "this operator's certificate (default $CKPT_TLS_CERT)"},
      {"tls-key", "FILE", "this operator's private key (default $CKPT_TLS_KEY)"},
      {"insecure", "", "talk plaintext to a coordinator beyond loopback"},
  };
  return *flags;
}

TlsFlags TlsFromArgs(const ParsedArgs& args) {
  TlsFlags tls;
  tls.files.ca = args.Get("tls-ca");
  tls.files.cert = args.Get("tls-cert");
  tls.files.key = args.Get("tls-key");
  tls.insecure = args.Has("insecure");
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(const std::string& address,
                                                               const TlsFlags& flags,
                                                               const std::string& command,
                                                               grpc::ChannelArguments args) {
  TlsFiles files = flags.files;
  if (files.empty()) {
    auto env = [](const char* name) {
      const char* value = std::getenv(name);
      return std::string(value != nullptr ? value : "");
    };
    files = {env("CKPT_TLS_CA"), env("CKPT_TLS_CERT"), env("CKPT_TLS_KEY")};
  }
  absl::StatusOr<TransportSecurity> security = ResolveTransportSecurity(
      files, flags.insecure, address, "--coordinator", absl::StrCat("ckptctl ", command));
  if (!security.ok()) {
    // The shared resolver names the daemons' flags (--tls_ca ...); ckptctl spells them
    // --tls-ca, so the advice it prints must too.
    return absl::Status(
        security.status().code(),
        absl::StrReplaceAll(
            security.status().message(),
            {{"--tls_ca", "--tls-ca"}, {"--tls_cert", "--tls-cert"}, {"--tls_key", "--tls-key"}}));
  }
  if (security->insecure_beyond_loopback) {
    std::fprintf(stderr, "warning: ckptctl %s talks to %s without TLS (--insecure)\n",
                 command.c_str(), address.c_str());
  }
  return MakeCoordinatorChannel(address, *security, std::move(args));
}

grpc::ChannelArguments StatusChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  return args;
}

absl::StatusOr<pb::GetStatusResponse> FetchCoordinatorStatus(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    const std::string& job, absl::Duration timeout) {
  auto stub = pb::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  pb::GetStatusRequest request;
  request.set_job(job);
  pb::GetStatusResponse response;
  absl::Status s = FromGrpcStatus(stub->GetStatus(&context, request, &response),
                                  absl::StrCat("GetStatus at coordinator ", address));
  if (!s.ok()) return s;
  return response;
}

}  // namespace ckpt::ckptctl
