// Benchmark: plan the reshard of a 70B-parameter transformer's training state (Llama-3-70B
// shapes in Megatron-core naming: 80 layers, hidden 8192, ffn 28672, 64 heads / 8 KV heads,
// vocab 128256) from TP=8 x DP=4 to TP=4 x DP=8.
//
// State: bf16 model parameters (TP-sharded, replicated over DP; layer norms replicated over
// TP too) and, with the distributed optimizer (ZeRO-1), fp32 master weights, exp_avg and
// exp_avg_sq: each TP rank's parameters are packed in reverse order into buckets of >= 40M
// elements and every bucket is split evenly over the DP ranks, so optimizer pieces are flat
// ranges of TP boxes.
//
//   bazel run //tools/bench:reshard_plan_benchmark   (.bazelrc already builds with -O2)
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "sharding/dtensor.h"
#include "sharding/flat_sharding.h"
#include "sharding/reshard_plan.h"

namespace ckpt {
namespace {

struct ParamSpec {
  std::string key;
  std::vector<int64_t> shape;
  int shard_dim;  // -1: replicated over TP
};

std::vector<ParamSpec> Llama70BParams() {
  const int64_t hidden = 8192, ffn = 28672, vocab = 128256, layers = 80;
  const int64_t qkv = (64 + 2 * 8) * 128;
  std::vector<ParamSpec> params;
  params.push_back({"embedding.word_embeddings.weight", {vocab, hidden}, 0});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("decoder.layers.", l, ".");
    params.push_back({p + "self_attention.linear_qkv.layer_norm_weight", {hidden}, -1});
    params.push_back({p + "self_attention.linear_qkv.weight", {qkv, hidden}, 0});
    params.push_back({p + "self_attention.linear_proj.weight", {hidden, hidden}, 1});
    params.push_back({p + "mlp.linear_fc1.layer_norm_weight", {hidden}, -1});
    params.push_back({p + "mlp.linear_fc1.weight", {2 * ffn, hidden}, 0});
    params.push_back({p + "mlp.linear_fc2.weight", {hidden, ffn}, 1});
  }
  params.push_back({"decoder.final_layernorm.weight", {hidden}, -1});
  params.push_back({"output_layer.weight", {vocab, hidden}, 0});
  return params;
}

// Every rank's pieces of the model and optimizer state for a TP x DP layout (rank =
// dp * tp_size + tp, Megatron's order).
std::vector<TensorPiece> TrainingState(const std::vector<ParamSpec>& params, int tp_size,
                                       int dp_size) {
  const DeviceMesh mesh = *DeviceMesh::Create({dp_size, tp_size});
  std::vector<TensorPiece> pieces;
  // Model parameters: [Replicate(), Shard(d) or Replicate()].
  std::vector<std::vector<LocalShard>> local(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const std::vector<Placement> placements = {
        Placement::Replicate(),
        p.shard_dim < 0 ? Placement::Replicate() : Placement::Shard(p.shard_dim)};
    local[i] = *ComputeAllLocalShards(p.shape, mesh, placements);
    for (int64_t r = 0; r < mesh.size(); ++r) {
      pieces.push_back(TensorPiece{p.key, r, DType::kBF16, p.shape, local[i][r].region(),
                                   local[i][r].replica_id});
    }
  }
  // Distributed optimizer: per TP rank, buckets of >= 40M elements in reverse order, each
  // split evenly over DP.
  const char* kStates[] = {"fp32_param", "exp_avg", "exp_avg_sq"};
  const int64_t kBucket = 40000000;
  for (int tp = 0; tp < tp_size; ++tp) {
    std::vector<std::vector<int>> buckets(1);
    int64_t filled = 0;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      buckets.back().push_back(i);
      filled += local[i][tp].region().BoxElements();
      if (filled >= kBucket) {
        buckets.emplace_back();
        filled = 0;
      }
    }
    for (const std::vector<int>& bucket : buckets) {
      std::vector<int64_t> numels;
      for (int i : bucket) numels.push_back(local[i][tp].region().BoxElements());
      auto slices = *FlatBufferSharding(numels, dp_size);
      for (int dp = 0; dp < dp_size; ++dp) {
        for (const BufferSlice& s : slices[dp]) {
          const ParamSpec& p = params[bucket[s.tensor]];
          Region region = local[bucket[s.tensor]][tp].region();
          region.flat = s.range;
          // TP-replicated parameters: the main replica is TP rank 0's.
          std::vector<int64_t> replica;
          if (p.shard_dim < 0) replica.push_back(tp);
          for (const char* state : kStates) {
            pieces.push_back(TensorPiece{absl::StrCat("optimizer.state.", state, ".", p.key),
                                         dp * tp_size + tp, DType::kF32, p.shape, region, replica});
          }
        }
      }
    }
  }
  return pieces;
}

struct Fixture {
  std::vector<TensorPiece> src = TrainingState(Llama70BParams(), 8, 4);
  std::vector<TensorPiece> dst = TrainingState(Llama70BParams(), 4, 8);
};

const Fixture& GetFixture() {
  static const Fixture* fixture = new Fixture();
  return *fixture;
}

void Report(benchmark::State& state, const Fixture& f, const ReshardPlan& plan) {
  int64_t params = 0;
  for (const ParamSpec& p : Llama70BParams()) params += WholeRegion(p.shape).BoxElements();
  state.counters["params_B"] = params / 1e9;
  state.counters["src_pieces"] = f.src.size();
  state.counters["dst_pieces"] = f.dst.size();
  state.counters["overlaps"] = plan.overlaps.size();
  state.counters["transfers"] = plan.transfers.size();
  state.counters["moved_GElems"] = plan.total_elements / 1e9;
  state.counters["local_GElems"] = plan.local_elements / 1e9;
}

void BM_PlanReshard70B(benchmark::State& state) {
  const Fixture& f = GetFixture();
  ReshardPlanOptions options;
  options.validate = state.range(0) != 0;
  ReshardPlan plan;
  for (auto _ : state) {
    auto result = PlanReshard(f.src, f.dst, options);
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      return;
    }
    plan = *std::move(result);
    benchmark::DoNotOptimize(plan);
  }
  Report(state, f, plan);
}
BENCHMARK(BM_PlanReshard70B)->ArgName("validate")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

// What an executor pays on top of planning: the CopyRuns of every overlap, one at a time.
void BM_AllOverlapRuns70B(benchmark::State& state) {
  const Fixture& f = GetFixture();
  ReshardPlanOptions options;
  options.validate = false;
  const ReshardPlan plan = *PlanReshard(f.src, f.dst, options);
  int64_t runs = 0;
  for (auto _ : state) {
    runs = 0;
    for (int64_t o = 0; o < static_cast<int64_t>(plan.overlaps.size()); ++o) {
      runs += OverlapRunsOf(plan, o, f.src, f.dst)->size();
    }
  }
  Report(state, f, plan);
  state.counters["runs_M"] = runs / 1e6;
}
BENCHMARK(BM_AllOverlapRuns70B)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckpt
