// Phases of `ckptctl plan distribute` on the 200,000 shards x 512 ranks line (the
// shape tools/bench/plan_distribute_bench.py generates: ids ["layerN.weight", [o, 0], null],
// 1-8 random holders, four sizes, 10 % cross-group, Python's separators): the fast path's
// parse, the distribution, the output line, and the three together (RunPlanLine). Process
// start, reading the file and writing the output are left to the Python bench.
// Run: bazel run -c opt //tools/bench:plan_distribute_benchmark
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "planner/distribute.h"
#include "tools/ckptctl/distribute_line_fast.h"
#include "tools/ckptctl/plan_lines.h"

namespace ckpt::ckptctl {
namespace {

std::string Megatron200kLine() {
  constexpr int kShards = 200000, kRanks = 512, kPerLayer = 200;
  std::mt19937_64 rng(16);
  std::vector<std::string> ids;
  for (int i = 0; i < kShards; ++i) {
    ids.push_back("[\"layer" + std::to_string(i / kPerLayer) + ".weight\", [" +
                  std::to_string((i % kPerLayer) * 128) + ", 0], null]");
  }
  std::string ranks, sizes, cross;
  const int64_t kSizes[] = {4096, 65536, 1 << 20, 3 << 20};
  for (int i = 0; i < kShards; ++i) {
    std::string holders;
    for (int h = 0, n = 1 + static_cast<int>(rng() % 8); h < n; ++h) {
      holders += (h ? ", " : "") + std::to_string(rng() % kRanks);
    }
    ranks += (i ? ", [" : "[") + ids[i] + ", [" + holders + "]]";
    sizes += (i ? ", [" : "[") + ids[i] + ", " + std::to_string(kSizes[rng() % 4]) + "]";
    if (rng() % 10 == 0) cross += (cross.empty() ? "" : ", ") + ids[i];
  }
  return "{\"num_ranks\": " + std::to_string(kRanks) + ", \"shard_to_ranks\": [" + ranks +
         "], \"shard_to_size\": [" + sizes + "], \"cross_group\": [" + cross + "]}";
}

const std::string& Line() {
  static const std::string* line = new std::string(Megatron200kLine());
  return *line;
}

void BM_Parse(benchmark::State& state) {
  for (auto _ : state) {
    std::optional<FastDistributeLine> parsed = ParseDistributeLineFast(Line(), false);
    if (!parsed) state.SkipWithError("the fast path refused the line");
    benchmark::DoNotOptimize(parsed);
  }
  state.SetBytesProcessed(state.iterations() * Line().size());
}
BENCHMARK(BM_Parse)->Unit(benchmark::kMillisecond);

void BM_Distribute(benchmark::State& state) {
  const std::optional<FastDistributeLine> parsed = ParseDistributeLineFast(Line(), false);
  for (auto _ : state) {
    auto assignment = DistributeShardsToRanks(parsed->input);
    if (!assignment.ok()) state.SkipWithError("the distribution failed");
    benchmark::DoNotOptimize(assignment);
  }
}
BENCHMARK(BM_Distribute)->Unit(benchmark::kMillisecond);

void BM_Format(benchmark::State& state) {
  const std::optional<FastDistributeLine> parsed = ParseDistributeLineFast(Line(), false);
  const auto assignment = DistributeShardsToRanks(parsed->input);
  for (auto _ : state) {
    std::string out = FormatDistributeResult(parsed->ids, *assignment, 0.0);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(BM_Format)->Unit(benchmark::kMillisecond);

void BM_RunPlanLine(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<std::string> out = RunPlanLine(PlanMode::kDistribute, Line());
    if (!out.ok()) state.SkipWithError("the line failed");
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(BM_RunPlanLine)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckpt::ckptctl

BENCHMARK_MAIN();
