// The coordinator's save planning alone (PlanSave over interned layout classes, as the
// coordinator holds gathered ranks) on ckpt_loadgen's GPT layout, for profiling how planning
// grows with the rank count without gRPC, gather or commit in the profile:
//   bazel build -c opt //tools/bench:save_plan_scale_benchmark
//   bazel-bin/tools/bench/save_plan_scale_benchmark --ranks 10240 [--layout tp8pp16]
//     [--model gpt-175b] [--repeat 1]
// Prints the setup and each plan's wall and CPU seconds, the parts' bytes and the process's
// peak RSS.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job_state.h"
#include "coordinator/operation_planners.h"
#include "planner/rank_pieces.h"
#include "tools/loadgen/gpt_pipeline_layout.h"

namespace ckpt {
namespace {

struct Args {
  int64_t ranks = 1024;
  std::string layout = "tp8pp16";
  std::string model = "gpt-175b";
  int repeat = 1;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--ranks") {
      args->ranks = std::atoll(value.c_str());
    } else if (flag == "--layout") {
      args->layout = value;
    } else if (flag == "--model") {
      args->model = value;
    } else if (flag == "--repeat") {
      args->repeat = std::atoi(value.c_str());
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && args->ranks > 0;
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

double PeakRssMib() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// An operation whose ranks hold the layout's pieces as the coordinator keeps them.
absl::StatusOr<coordinator::Operation> GatheredOperation(const loadgen::GptPipelineLayout& gpt) {
  coordinator::Operation op;
  op.id = "op-bench";
  op.job = "bench";
  op.world_size = static_cast<int>(gpt.world_size());
  op.ranks.resize(op.world_size);
  PieceListInterner interner;
  for (int r = 0; r < op.world_size; ++r) {
    absl::StatusOr<pb::RankState> state = gpt.RankState(r);
    if (!state.ok()) return state.status();
    op.ranks[r].shards = RankPieces::Describe(state->shards());
    interner.Intern(&op.ranks[r].shards, state->shards());
    op.ranks[r].joined = true;
  }
  return op;
}

int Run(const Args& args) {
  absl::StatusOr<GptConfig> model = loadgen::ModelByName(args.model);
  absl::StatusOr<loadgen::Parallelism> parallel =
      model.ok() ? loadgen::ParseParallelism(args.layout, args.ranks)
                 : absl::StatusOr<loadgen::Parallelism>(model.status());
  absl::StatusOr<loadgen::GptPipelineLayout> gpt =
      parallel.ok() ? loadgen::GptPipelineLayout::Create(*model, *parallel)
                    : absl::StatusOr<loadgen::GptPipelineLayout>(parallel.status());
  if (!gpt.ok()) {
    std::fprintf(stderr, "%s\n", gpt.status().ToString().c_str());
    return 1;
  }
  double cpu = CpuSeconds();
  absl::StatusOr<coordinator::Operation> op = GatheredOperation(*gpt);
  if (!op.ok()) {
    std::fprintf(stderr, "%s\n", op.status().ToString().c_str());
    return 1;
  }
  std::printf("ranks %lld setup_cpu_s %.2f rss_mib %.1f\n", static_cast<long long>(args.ranks),
              CpuSeconds() - cpu, PeakRssMib());
  for (int i = 0; i < args.repeat; ++i) {
    cpu = CpuSeconds();
    const auto wall = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<coordinator::RankPlan>> plans =
        coordinator::PlanSave(*op, SavePlanOptions(), "/tmp/staging-dir-of-the-bench");
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    if (!plans.ok()) {
      std::fprintf(stderr, "%s\n", plans.status().ToString().c_str());
      return 1;
    }
    int64_t bytes = 0;
    for (const coordinator::RankPlan& plan : *plans)
      bytes += static_cast<int64_t>(plan.part.size());
    std::printf("plan wall_s %.2f cpu_s %.2f parts_mib %.1f peak_rss_mib %.1f\n", wall_s,
                CpuSeconds() - cpu, static_cast<double>(bytes) / (1 << 20), PeakRssMib());
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  ckpt::Args args;
  if (!ckpt::ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: save_plan_scale_benchmark --ranks N [--layout tp8pp16] "
                 "[--model gpt-175b] [--repeat 1]\n");
    return 2;
  }
  return ckpt::Run(args);
}
