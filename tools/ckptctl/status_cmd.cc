// `ckptctl status --coordinator HOST:PORT [--job J]`: the coordinator's workers (live and
// dead), jobs (ranks attached), operations in flight or recently finished, with progress, and
// the memory tier's checkpoints (mem://<name>) with the workers holding each file's copies.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/wire_names.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/coordinator_channel.h"

namespace ckpt::ckptctl {
namespace {

std::string ProgressBar(int64_t done, int64_t total) {
  constexpr int kWidth = 24;
  int filled = total > 0 ? static_cast<int>(kWidth * static_cast<double>(done) / total) : 0;
  int percent = total > 0 ? static_cast<int>(100.0 * static_cast<double>(done) / total) : 0;
  return absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ",
                      percent, "% ", HumanBytes(done), " / ", HumanBytes(total));
}

// "host,device": the worker's memory kinds as users spell them.
std::string MemoryKindNames(const pb::WorkerInfo& info) {
  std::vector<std::string> names;
  for (int kind : info.memory_kinds()) {
    names.push_back(MemoryKindName(static_cast<pb::MemoryKind>(kind)));
  }
  return absl::StrJoin(names, ",");
}

// The memory tier: each memory checkpoint with its bytes and, per data file, who holds a copy.
void PrintMemoryCheckpoints(const pb::GetStatusResponse& status) {
  std::printf("memory checkpoints: %d\n", status.memory_checkpoints_size());
  for (const pb::MemoryCheckpointStatus& m : status.memory_checkpoints()) {
    std::printf("  mem://%s  %s in %d files  %d copies\n", m.name().c_str(),
                HumanBytes(m.bytes()).c_str(), m.files(), m.replicas_size());
    if (!m.persist().empty()) std::printf("    %s\n", m.persist().c_str());
    std::string file;
    std::vector<std::string> holders;
    auto flush = [&] {
      if (file.empty()) return;
      std::printf("      %s  on %s\n", file.c_str(), absl::StrJoin(holders, " ").c_str());
    };
    for (const pb::MemoryReplicaStatus& r : m.replicas()) {
      if (r.file() != file) {
        flush();
        file = r.file();
        holders.clear();
      }
      holders.push_back(absl::StrCat(r.worker_id(), "@", r.host()));
    }
    flush();
  }
}

void Print(const std::string& coordinator, const pb::GetStatusResponse& status) {
  int live = 0;
  for (const auto& w : status.workers()) live += w.alive() ? 1 : 0;
  std::printf("coordinator %s (worker lease %lld ms, heartbeat lag %lld ms)\n", coordinator.c_str(),
              static_cast<long long>(status.lease_ms()),
              static_cast<long long>(status.heartbeat_lag_ms()));
  std::printf("workers: %d live, %d dead\n", live, status.workers_size() - live);
  for (const auto& w : status.workers()) {
    const pb::WorkerInfo& i = w.info();
    std::string line = absl::StrCat(
        "  ", w.worker_id(), "  ", w.alive() ? "alive" : "DEAD ", "  host=", i.host(),
        " pid=", i.pid(), " local_rank=", i.local_rank(),
        " gpu=", i.gpu() < 0 ? std::string("none") : absl::StrCat(i.gpu()), i.nccl() ? " nccl" : "",
        " memory=", MemoryKindNames(i), " data_plane=", i.data_plane_address(), "  heartbeat ",
        w.ms_since_heartbeat(), " ms ago");
    if (!w.alive()) absl::StrAppend(&line, "  (", w.death_cause(), ")");
    std::printf("%s\n", line.c_str());
  }
  std::printf("jobs: %d\n", status.jobs_size());
  for (const auto& j : status.jobs()) {
    std::vector<std::string> ranks;
    for (const auto& r : j.ranks()) {
      ranks.push_back(absl::StrCat(r.rank(), "@", r.host(), "/", r.worker_id()));
    }
    std::printf("  %s  world_size=%d  attached %d/%d  %s\n", j.name().c_str(), j.world_size(),
                j.ranks_size(), j.world_size(), absl::StrJoin(ranks, " ").c_str());
  }
  std::printf("operations: %d\n", status.operations_size());
  for (const auto& op : status.operations()) {
    std::string phase = OperationPhaseName(op.phase());
    std::string line =
        absl::StrCat("  ", op.id(), "  ", OperationKindName(op.kind()), " ", op.path(),
                     "  job=", op.job(), "  ", phase, "  requested by ", op.requested_by());
    if (op.phase() == pb::PHASE_GATHERING) {
      absl::StrAppend(&line, "  ranks joined ", op.joined_ranks(), "/", op.world_size());
    } else if (op.phase() == pb::PHASE_EXECUTING || op.phase() == pb::PHASE_COMMITTING ||
               op.phase() == pb::PHASE_DONE) {
      absl::StrAppend(&line, "  ", ProgressBar(op.bytes_done(), op.bytes_total()),
                      "  ranks reported ", op.reported_ranks(), "/", op.world_size());
    }
    std::printf("%s\n", line.c_str());
    if (op.phase() == pb::PHASE_ABORTED) {
      std::printf("      %s\n", op.status().message().c_str());
    }
  }
  PrintMemoryCheckpoints(status);
}

int RunStatus(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(StatusSpec(), args, &a)) return *code;
  if (!a.positional.empty()) return Usage("status", "takes no positional arguments");
  if (!a.Has("coordinator")) return Usage("status", "--coordinator HOST:PORT is required");
  const std::string coordinator = a.Get("coordinator");
  const std::string job = a.Get("job");
  const TlsFlags tls = TlsFromArgs(a);
  absl::Duration timeout = absl::Seconds(5);
  if (absl::Status s = DurationFlag(a, "timeout", &timeout); !s.ok()) {
    return Usage("status", std::string(s.message()));
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      DialCoordinator(coordinator, tls, "status", StatusChannelArguments());
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<pb::GetStatusResponse> response =
      FetchCoordinatorStatus(*channel, coordinator, job, timeout);
  if (!response.ok()) {
    std::fprintf(stderr, "ckptctl status: %s\n", response.status().ToString().c_str());
    return 1;
  }
  Print(coordinator, *response);
  return 0;
}

}  // namespace

const CommandSpec& StatusSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "status", "usage: ckptctl status --coordinator HOST:PORT [--job NAME] [flags]",
      "Shows the coordinator's workers (live and dead, with host, pid, GPU and heartbeat age),\n"
      "its jobs (ranks attached) and its operations (in flight with progress, and recently\n"
      "finished with their outcome).\n",
      With({{"coordinator", "HOST:PORT", "the coordinator, required"},
            {"job", "NAME", "only this job's ranks and operations"},
            {"timeout", "DURATION", "deadline of the status call (default 5s)", "timeout_ms"}},
           TlsFlagSpecs())};
  return *spec;
}

int RunStatusCommand(const std::vector<std::string>& args) { return RunStatus(args); }

}  // namespace ckpt::ckptctl
