// Speed of the save and load planners on a Megatron-like job: 512 ranks = TP 8 x DP 64,
// 400 2-d tensors split on dim 0 over TP and replicated over DP (204,800 gathered pieces).
// The load reshards onto TP 4 x DP 128 (204,800 requests).
// Run: bazel run //tools/bench:plan_benchmark
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"

namespace ckpt {
namespace {

constexpr int64_t kTensors = 400, kRows = 4096, kCols = 1024;

std::string Key(int64_t t) {
  return "decoder.layers." + std::to_string(t / 4) + ".w" + std::to_string(t % 4);
}

std::vector<TensorPiece> SaveLayout(int64_t tp, int64_t dp) {
  std::vector<TensorPiece> pieces;
  for (int64_t r = 0; r < tp * dp; ++r) {
    const int64_t t_rank = r % tp, d_rank = r / tp;
    for (int64_t t = 0; t < kTensors; ++t) {
      TensorPiece p;
      p.key = Key(t);
      p.rank = r;
      p.dtype = DType::kBF16;
      p.global_shape = {kRows, kCols};
      p.region = Region{{t_rank * (kRows / tp), 0}, {kRows / tp, kCols}, std::nullopt};
      p.replica_id = {0, d_rank};
      pieces.push_back(std::move(p));
    }
  }
  return pieces;
}

void BM_SavePlanTp8Dp64(benchmark::State& state) {
  const auto pieces = SaveLayout(8, 64);
  for (auto _ : state) {
    auto plan = BuildSavePlan(pieces, 512);
    if (!plan.ok()) state.SkipWithError(std::string(plan.status().message()).c_str());
    benchmark::DoNotOptimize(plan);
  }
  state.SetItemsProcessed(state.iterations() * pieces.size());
}
BENCHMARK(BM_SavePlanTp8Dp64)->Unit(benchmark::kMillisecond);

struct LoadInputs {
  std::vector<TensorMeta> tensors;
  std::vector<StoredPieceInfo> pieces;
  std::vector<LoadRequest> requests;
};

LoadInputs ReshardTp8ToTp4() {
  LoadInputs in;
  const int64_t elem = 2, rows_stored = kRows / 8, rows_loaded = kRows / 4;
  for (int64_t t = 0; t < kTensors; ++t) {
    in.tensors.push_back({Key(t), DType::kBF16, {kRows, kCols}});
    for (int64_t s = 0; s < 8; ++s) {
      in.pieces.push_back({Key(t), Region{{s * rows_stored, 0}, {rows_stored, kCols}, {}},
                           "data/r" + std::to_string(s) + "_0.safetensors",
                           t * rows_stored * kCols * elem, rows_stored * kCols * elem});
    }
  }
  for (int64_t r = 0; r < 512; ++r) {
    for (int64_t t = 0; t < kTensors; ++t) {
      in.requests.push_back(
          {r, Key(t), Region{{(r % 4) * rows_loaded, 0}, {rows_loaded, kCols}, {}}});
    }
  }
  return in;
}

void BM_LoadPlanReshardTp8ToTp4Dp128(benchmark::State& state) {
  const LoadInputs in = ReshardTp8ToTp4();
  LoadPlanOptions options;
  options.memory_budget_bytes = int64_t{2} << 30;
  for (auto _ : state) {
    auto plan = BuildLoadPlan(in.tensors, in.pieces, in.requests, 512, options);
    if (!plan.ok()) state.SkipWithError(std::string(plan.status().message()).c_str());
    benchmark::DoNotOptimize(plan);
  }
  state.SetItemsProcessed(state.iterations() * in.requests.size());
}
BENCHMARK(BM_LoadPlanReshardTp8ToTp4Dp128)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckpt

BENCHMARK_MAIN();
