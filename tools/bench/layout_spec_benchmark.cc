// Speed of expanding a target layout into every rank's pieces (LayoutSpec::AllPieces), the
// first step of every reshard plan, for layouts that flat-shard over many ranks:
//   FlatOneTensor/N:   one 4096 x 4096 fp32 tensor flat-sharded over N ranks (pure FSDP);
//   FlatGpt/N:         a GPT-like state of 64 tensors, pure FSDP over N ranks;
//   TpFlatDpGpt/N:     the same state, TP=8 x DP=N/8 with the optimizer state flat over DP
//                      (Megatron's ZeRO-1 layout).
// Each rank's flat range used to be found by building the whole even split per rank
// (quadratic in ranks: 4,096 ranks took ~50 s on a GPT state); it is now computed directly.
// Run: bazel run -c opt //tools/bench:layout_spec_benchmark
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "planner/layout_spec.h"

namespace ckpt {
namespace {

// 8 layers of (qkv, proj, fc1, fc2 weights and two norms) in bf16 plus the embedding, and
// an fp32 optimizer copy of the first 8 of them: 64 tensors.
std::vector<TensorMeta> GptLikeTensors() {
  const int64_t h = 1024;
  std::vector<TensorMeta> tensors;
  tensors.push_back(TensorMeta{"embedding.word_embeddings.weight", DType::kBF16, {32768, h}});
  for (int l = 0; l < 8 && tensors.size() < 56; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    tensors.push_back(TensorMeta{p + "attention.qkv.weight", DType::kBF16, {3 * h, h}});
    tensors.push_back(TensorMeta{p + "attention.proj.weight", DType::kBF16, {h, h}});
    tensors.push_back(TensorMeta{p + "mlp.fc1.weight", DType::kBF16, {4 * h, h}});
    tensors.push_back(TensorMeta{p + "mlp.fc2.weight", DType::kBF16, {h, 4 * h}});
    tensors.push_back(TensorMeta{p + "input_norm.weight", DType::kBF16, {h}});
    tensors.push_back(TensorMeta{p + "mlp_norm.weight", DType::kBF16, {h}});
    if (tensors.size() > 56) tensors.resize(56);
  }
  for (size_t i = 0; tensors.size() < 64; ++i) {
    TensorMeta t = tensors[i];
    t.key = "optimizer.exp_avg." + t.key;
    t.dtype = DType::kF32;
    tensors.push_back(t);
  }
  return tensors;
}

void Expand(benchmark::State& state, const std::string& layout_json,
            const std::vector<TensorMeta>& tensors) {
  absl::StatusOr<LayoutSpec> layout = LayoutSpec::Parse(layout_json);
  if (!layout.ok()) {
    state.SkipWithError(std::string(layout.status().message()).c_str());
    return;
  }
  int64_t pieces = 0;
  for (auto _ : state) {
    absl::StatusOr<std::vector<TensorPiece>> all = layout->AllPieces(tensors);
    if (!all.ok()) {
      state.SkipWithError(std::string(all.status().message()).c_str());
      return;
    }
    pieces = static_cast<int64_t>(all->size());
    benchmark::DoNotOptimize(all);
  }
  state.counters["pieces"] = static_cast<double>(pieces);
}

std::string FsdpLayout(int64_t ranks) {
  return absl::StrCat(R"J({"mesh": {"dp": )J", ranks,
                      R"J(}, "rules": [{"match": "*", "flat": {"over": "dp"}}]})J");
}

void BM_FlatOneTensor(benchmark::State& state) {
  Expand(state, FsdpLayout(state.range(0)), {TensorMeta{"w", DType::kF32, {4096, 4096}}});
}
BENCHMARK(BM_FlatOneTensor)->RangeMultiplier(4)->Range(1024, 65536)->Unit(benchmark::kMillisecond);

void BM_FlatGpt(benchmark::State& state) {
  Expand(state, FsdpLayout(state.range(0)), GptLikeTensors());
}
BENCHMARK(BM_FlatGpt)->RangeMultiplier(4)->Range(1024, 65536)->Unit(benchmark::kMillisecond);

void BM_TpFlatDpGpt(benchmark::State& state) {
  const std::string layout = absl::StrCat(
      R"J({"mesh": {"dp": )J", state.range(0) / 8, R"J(, "tp": 8}, "rules": [)J",
      R"J({"match": "optimizer.*", "placements": ["Replicate()", "Shard(0)"], "flat": {"over": "dp"}},)J",
      R"J({"match": "*.fc2.weight", "placements": ["Replicate()", "Shard(1)"]},)J",
      R"J({"match": "*", "placements": ["Replicate()", "Shard(0)"]}]})J");
  Expand(state, layout, GptLikeTensors());
}
BENCHMARK(BM_TpFlatDpGpt)->RangeMultiplier(4)->Range(1024, 65536)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ckpt

BENCHMARK_MAIN();
