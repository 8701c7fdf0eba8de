// `ckptctl transfer list|ops --coordinator HOST:PORT`: live transfer (issue 17) for operators.
//   list: every published name (xfer://<name>) with its kept versions, their bytes, when they
//         were published and the workers holding them.
//   ops:  the publishes and receives in flight or recently finished, with their phase, the
//         serving participants a receive added and whether its plan was reused.
// A publish can be requested of a running job with `ckptctl save --job J xfer://<name>` (its
// ranks publish the next version at their next Poll).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/transfer_path.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/wire_names.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/coordinator_channel.h"

namespace ckpt::ckptctl {
namespace {

void PrintPublished(const pb::GetStatusResponse& status) {
  std::printf("published names: %d\n", status.published_size());
  for (const pb::PublishedStatus& p : status.published()) {
    std::printf("  xfer://%s  %d version(s) kept\n", p.name().c_str(), p.versions_size());
    for (const pb::PublishedVersionStatus& v : p.versions()) {
      std::printf(
          "    xfer://%s@%lld  %s  mem://%s  published %s\n      held by %s\n", p.name().c_str(),
          static_cast<long long>(v.version()), HumanBytes(v.bytes()).c_str(),
          v.memory_checkpoint().c_str(),
          absl::FormatTime(absl::FromUnixMillis(v.published_unix_ms())).c_str(),
          v.holders().empty() ? "(no copy left)" : absl::StrJoin(v.holders(), ", ").c_str());
    }
  }
}

void PrintTransferOperations(const pb::GetStatusResponse& status) {
  for (const pb::OperationStatus& op : status.operations()) {
    if (!IsTransferPath(op.path())) continue;
    const bool receive = op.kind() == pb::OPERATION_LOAD;
    std::string line = absl::StrCat(
        "  ", op.id(), "  ", receive ? "receive" : "publish", " ", op.path(), "  job=", op.job(),
        "  ", OperationPhaseName(op.phase()), "  ", op.world_size(), " ranks");
    if (receive) {
      if (op.received_version() > 0)
        absl::StrAppend(&line, " (version ", op.received_version(), ")");
      absl::StrAppend(&line, " + ", op.transfer_serving_ranks(), " serving  plan ",
                      op.transfer_plan_reused() ? "reused" : "planned");
    }
    absl::StrAppend(&line, "  ", HumanBytes(op.bytes_done()), " / ", HumanBytes(op.bytes_total()));
    std::printf("%s\n", line.c_str());
    if (op.phase() == pb::PHASE_ABORTED) std::printf("      %s\n", op.status().message().c_str());
  }
}

int RunTransfer(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(TransferSpec(), args, &a)) return *code;
  if (a.positional.size() != 1 || (a.positional[0] != "list" && a.positional[0] != "ops")) {
    return Usage("transfer", "expects one action: list or ops");
  }
  if (!a.Has("coordinator")) return Usage("transfer", "--coordinator HOST:PORT is required");
  const std::string coordinator = a.Get("coordinator");
  absl::Duration timeout = absl::Seconds(5);
  if (absl::Status s = DurationFlag(a, "timeout", &timeout); !s.ok()) {
    return Usage("transfer", std::string(s.message()));
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      DialCoordinator(coordinator, TlsFromArgs(a), "transfer", StatusChannelArguments());
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<pb::GetStatusResponse> status =
      FetchCoordinatorStatus(*channel, coordinator, a.Get("job"), timeout);
  if (!status.ok()) {
    std::fprintf(stderr, "ckptctl transfer: %s\n", status.status().ToString().c_str());
    return 1;
  }
  const pb::GetStatusResponse& response = *status;
  if (a.positional[0] == "list") {
    PrintPublished(response);
  } else {
    PrintTransferOperations(response);
  }
  return 0;
}

}  // namespace

const CommandSpec& TransferSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "transfer", "usage: ckptctl transfer list|ops --coordinator HOST:PORT [flags]",
      "Live transfer between jobs. list: the published names (xfer://<name>) with their kept\n"
      "versions, bytes and holding workers. ops: publishes and receives in flight or recently\n"
      "finished, with the serving participants of each receive and whether its plan was\n"
      "reused. Request a publish of a running job with `ckptctl save --job J xfer://<name>`.\n",
      With({{"coordinator", "HOST:PORT", "the coordinator, required"},
            {"job", "NAME", "ops: only this job's operations"},
            {"timeout", "DURATION", "deadline of the status call (default 5s)"}},
           TlsFlagSpecs())};
  return *spec;
}

int RunTransferCommand(const std::vector<std::string>& args) { return RunTransfer(args); }

}  // namespace ckpt::ckptctl
