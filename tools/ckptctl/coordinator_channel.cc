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

namespace {

// Adds one page to what the earlier pages gathered: a job or memory checkpoint that continues
// from the previous page (the same name first on this page) gets the rest of its ranks or
// replicas.
void MergeStatusPage(pb::GetStatusResponse page, pb::GetStatusResponse* all) {
  for (pb::WorkerStatus& w : *page.mutable_workers()) *all->add_workers() = std::move(w);
  for (pb::JobStatus& job : *page.mutable_jobs()) {
    if (all->jobs_size() > 0 && all->jobs(all->jobs_size() - 1).name() == job.name()) {
      pb::JobStatus* last = all->mutable_jobs(all->jobs_size() - 1);
      for (pb::RankAttachment& r : *job.mutable_ranks()) *last->add_ranks() = std::move(r);
    } else {
      *all->add_jobs() = std::move(job);
    }
  }
  for (pb::OperationStatus& op : *page.mutable_operations()) *all->add_operations() = std::move(op);
  for (pb::MemoryCheckpointStatus& m : *page.mutable_memory_checkpoints()) {
    const int n = all->memory_checkpoints_size();
    if (n > 0 && all->memory_checkpoints(n - 1).name() == m.name()) {
      pb::MemoryCheckpointStatus* last = all->mutable_memory_checkpoints(n - 1);
      for (pb::MemoryReplicaStatus& r : *m.mutable_replicas()) *last->add_replicas() = std::move(r);
    } else {
      *all->add_memory_checkpoints() = std::move(m);
    }
  }
  for (pb::PublishedStatus& p : *page.mutable_published()) *all->add_published() = std::move(p);
  all->set_lease_ms(page.lease_ms());
  all->set_incarnation(page.incarnation());
  all->set_started_unix_ms(page.started_unix_ms());
  all->set_heartbeat_lag_ms(page.heartbeat_lag_ms());
}

}  // namespace

absl::StatusOr<pb::GetStatusResponse> FetchCoordinatorStatus(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    const std::string& job, absl::Duration timeout) {
  auto stub = pb::Coordinator::NewStub(channel);
  const absl::Time deadline = absl::Now() + timeout;
  pb::GetStatusRequest request;
  request.set_job(job);
  pb::GetStatusResponse all;
  // Every page (the coordinator answers in pages, docs/services.md), within one deadline; a
  // coordinator that restarted between pages (another incarnation) starts the listing over.
  for (int page = 0;; ++page) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    pb::GetStatusResponse response;
    absl::Status s =
        FromGrpcStatus(stub->GetStatus(&context, request, &response),
                       absl::StrCat("GetStatus at coordinator ", address,
                                    page > 0 ? absl::StrCat(" (page ", page + 1, ")") : ""));
    if (!s.ok()) return s;
    if (!request.page_token().empty() && response.incarnation() != all.incarnation()) {
      all.Clear();
      request.clear_page_token();
      continue;
    }
    std::string next = response.next_page_token();
    MergeStatusPage(std::move(response), &all);
    if (next.empty()) return all;
    request.set_page_token(std::move(next));
  }
}

}  // namespace ckpt::ckptctl
