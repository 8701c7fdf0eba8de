// `ckptctl save|load --coordinator HOST:PORT --job J <checkpoint>`: operator-requested save or
// load of a running job. The job's trainers perform it at their next Client::Poll; the command
// waits for the end (the commit, for a save), shows progress, and prints a summary.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/wire_names.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/coordinator_channel.h"
#include "tools/ckptctl/operation_wait.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kUsage[] =
    "usage: ckptctl %s --coordinator HOST:PORT --job NAME [--timeout_s N]\n"
    "                    [--arrival_deadline_s N] [--algorithm A] [--memory_budget_bytes N]\n"
    "                    <checkpoint>\n\n"
    "Asks the trainers of a running job to %s the checkpoint at their next Poll, waits until\n"
    "the operation ends (for a save: until it is committed, i.e. durable), showing progress,\n"
    "and prints a summary. Exits 1 with the coordinator's diagnosis when it is aborted.\n"
    "  --timeout_s           give up waiting after this long (default 3600; the operation goes "
    "on)\n"
    "  --arrival_deadline_s  how long the trainers have to join (default: the coordinator's)\n"
    "  --algorithm           load: how workers move what one of them read to the others:\n"
    "                        broadcast, overlap_all_to_all, gather_rounds, gather_object, or\n"
    "                        direct (each reads what it needs; default: the coordinator's)\n"
    "  --memory_budget_bytes load: bytes in flight per rank and wave (default: the "
    "coordinator's)\n";

double Gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

int Run(const std::vector<std::string>& args, pb::OperationKind kind, const char* name) {
  std::string coordinator, job, path;
  int64_t timeout_s = 3600, arrival_s = 0, budget = 0;
  std::string algorithm;
  TlsFlags tls;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::printf(kUsage, name, name);
      std::fputs(kTlsHelp, stdout);
      return 0;
    } else if (ConsumeTlsFlag(args, &i, &tls)) {
    } else if (a == "--coordinator" && value(&v)) {
      coordinator = v;
    } else if (a == "--job" && value(&v)) {
      job = v;
    } else if (a == "--timeout_s" && value(&v) && absl::SimpleAtoi(v, &timeout_s) &&
               timeout_s > 0) {
    } else if (a == "--arrival_deadline_s" && value(&v) && absl::SimpleAtoi(v, &arrival_s) &&
               arrival_s > 0) {
    } else if (kind == pb::OPERATION_LOAD && a == "--algorithm" && value(&algorithm) &&
               !algorithm.empty()) {
    } else if (kind == pb::OPERATION_LOAD && a == "--memory_budget_bytes" && value(&v) &&
               absl::SimpleAtoi(v, &budget) && budget > 0) {
    } else if (!a.empty() && a[0] != '-' && path.empty()) {
      path = a;
    } else {
      std::fprintf(stderr, "ckptctl %s: bad or incomplete argument \"%s\" (see --help)\n", name,
                   a.c_str());
      return 2;
    }
  }
  if (coordinator.empty() || job.empty() || path.empty()) {
    std::fprintf(stderr,
                 "ckptctl %s: --coordinator, --job and a checkpoint path are required "
                 "(see --help)\n",
                 name);
    return 2;
  }
  absl::StatusOr<pb::LoadAlgorithm> load_algorithm = ParseLoadAlgorithm(algorithm);
  if (!load_algorithm.ok()) {
    std::fprintf(stderr, "ckptctl %s: --algorithm: %s\n", name,
                 std::string(load_algorithm.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DialCoordinator(coordinator, tls, name);
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = pb::Coordinator::NewStub(*channel);
  const absl::Time start = absl::Now();
  // The coordinator accepts only absolute paths (under its checkpoint roots): a relative one
  // means this shell's working directory.
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (!ec) path = absolute.string();
  pb::RequestOperationRequest request;
  request.set_job(job);
  request.set_kind(kind);
  request.set_path(path);
  request.set_arrival_deadline_ms(arrival_s * 1000);
  request.set_load_algorithm(*load_algorithm);
  request.set_load_memory_budget_bytes(budget);
  pb::RequestOperationResponse requested;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    absl::Status s = FromGrpcStatus(stub->RequestOperation(&context, request, &requested),
                                    absl::StrCat("RequestOperation at coordinator ", coordinator));
    if (!s.ok()) {
      std::fprintf(stderr, "ckptctl %s: %s\n", name, s.ToString().c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "%s requested as %s; waiting for the trainers of job %s\n", name,
               requested.operation_id().c_str(), job.c_str());
  std::string last_line;
  absl::StatusOr<pb::OperationStatus> waited = WaitForOperation(
      stub.get(), coordinator, requested.operation_id(), start + absl::Seconds(timeout_s),
      absl::Seconds(1), [&](const pb::OperationStatus& op) {
        std::string line = op.phase() == pb::PHASE_GATHERING
                               ? absl::StrCat("gathering: ", op.joined_ranks(), "/",
                                              op.world_size(), " ranks joined")
                               : absl::StrCat(pb::OperationPhase_Name(op.phase()).substr(6), ": ",
                                              absl::StrFormat("%.3f", Gb(op.bytes_done())), " / ",
                                              absl::StrFormat("%.3f", Gb(op.bytes_total())), " GB");
        if (line != last_line) std::fprintf(stderr, "  %s\n", line.c_str());
        last_line = line;
      });
  if (!waited.ok()) {
    std::fprintf(stderr, "\nckptctl %s: %s\n", name, waited.status().ToString().c_str());
    return 1;
  }
  const pb::OperationStatus& op = *waited;
  if (!IsFinal(op)) {
    std::fprintf(stderr, "ckptctl %s: %s is still %s after %llds (it goes on)\n", name,
                 op.id().c_str(), last_line.c_str(), static_cast<long long>(timeout_s));
    return 1;
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (op.phase() == pb::PHASE_ABORTED) {
    std::fprintf(stderr, "ckptctl %s: %s\n", name, op.status().message().c_str());
    return 1;
  }
  std::printf("%s %s: job %s, %d ranks, %lld bytes in %.2f s (%.2f GB/s)%s\n", op.id().c_str(),
              name, job.c_str(), op.world_size(), static_cast<long long>(op.bytes_total()), seconds,
              seconds > 0 ? Gb(op.bytes_total()) / seconds : 0.0,
              kind == pb::OPERATION_SAVE
                  ? absl::StrCat(", committed at ", path).c_str()
                  : absl::StrCat(", ", op.bytes_read(), " bytes read from storage").c_str());
  return 0;
}

}  // namespace

int RunSaveCommand(const std::vector<std::string>& args) {
  return Run(args, pb::OPERATION_SAVE, "save");
}
int RunLoadCommand(const std::vector<std::string>& args) {
  return Run(args, pb::OPERATION_LOAD, "load");
}

}  // namespace ckpt::ckptctl
