#include "tools/ckptctl/coordinator_channel.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_auth.h"

namespace ckpt::ckptctl {

const char kTlsHelp[] =
    "  --tls_ca F --tls_cert F --tls_key F\n"
    "                        the CA and this operator's certificate and key (ckptctl certs;\n"
    "                        default: $CKPT_TLS_CA, $CKPT_TLS_CERT, $CKPT_TLS_KEY)\n"
    "  --insecure            talk plaintext to a coordinator beyond loopback\n";

bool ConsumeTlsFlag(const std::vector<std::string>& args, size_t* i, TlsFlags* flags) {
  const std::string& arg = args[*i];
  if (arg == "--insecure") {
    flags->insecure = true;
    return true;
  }
  for (auto [name, out] : {std::pair<const char*, std::string*>{"--tls_ca", &flags->files.ca},
                           {"--tls_cert", &flags->files.cert},
                           {"--tls_key", &flags->files.key}}) {
    if (arg == name) {
      if (*i + 1 >= args.size()) return false;
      *out = args[++*i];
      return true;
    }
    if (absl::StartsWith(arg, absl::StrCat(name, "="))) {
      *out = arg.substr(std::string(name).size() + 1);
      return true;
    }
  }
  return false;
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
  if (!security.ok()) return security.status();
  if (security->insecure_beyond_loopback) {
    std::fprintf(stderr, "warning: ckptctl %s talks to %s without TLS (--insecure)\n",
                 command.c_str(), address.c_str());
  }
  return MakeCoordinatorChannel(address, *security, std::move(args));
}

}  // namespace ckpt::ckptctl
