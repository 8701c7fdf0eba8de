// Cost of the coordinator's metadata gather (every rank joining an operation with its shard
// metadata) and of turning it into per-rank save plan parts, for growing world sizes.
//   bazel run -c opt //tools/bench:job_state_benchmark
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "coordinator/job_state.h"
#include "coordinator/operation_planners.h"

namespace ckpt::coordinator {
namespace {

// Rank r of a TP=world layout: `shards` tensors of shape (world*64, 1024), row block r each,
// plus one replicated norm per rank (main replica on rank 0).
std::vector<pb::PieceMeta> RankShards(int rank, int world, int shards) {
  std::vector<pb::PieceMeta> out;
  for (int t = 0; t < shards; ++t) {
    pb::PieceMeta s;
    s.mutable_tensor()->set_key(absl::StrCat("layers.", t, ".weight"));
    s.mutable_tensor()->set_dtype(pb::DTYPE_BF16);
    s.mutable_tensor()->add_global_shape(int64_t{world} * 64);
    s.mutable_tensor()->add_global_shape(1024);
    s.mutable_region()->add_offsets(int64_t{rank} * 64);
    s.mutable_region()->add_offsets(0);
    s.mutable_region()->add_lengths(64);
    s.mutable_region()->add_lengths(1024);
    out.push_back(std::move(s));
  }
  pb::PieceMeta norm;
  norm.mutable_tensor()->set_key("final_norm");
  norm.mutable_tensor()->set_dtype(pb::DTYPE_F32);
  norm.mutable_tensor()->add_global_shape(1024);
  norm.mutable_region()->add_offsets(0);
  norm.mutable_region()->add_lengths(1024);
  norm.add_replica_id(rank);
  out.push_back(std::move(norm));
  return out;
}

void BM_GatherAllRanks(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int shards = static_cast<int>(state.range(1));
  std::vector<std::vector<pb::PieceMeta>> metadata;
  for (int r = 0; r < world; ++r) metadata.push_back(RankShards(r, world, shards));
  FakeClock clock;
  for (auto _ : state) {
    JobState jobs(&clock, JobStateOptions());
    for (int r = 0; r < world; ++r) {
      JoinRequest join;
      join.job = "bench";
      join.world_size = world;
      join.rank = r;
      join.path = "/ckpt";
      join.location = RankLocation{absl::StrCat("w-", r), "host", r + 1};
      join.shards = metadata[r];
      benchmark::DoNotOptimize(jobs.JoinOperation(join));
    }
  }
  state.counters["shards"] = static_cast<double>(world) * (shards + 1);
  state.SetItemsProcessed(state.iterations() * world * (shards + 1));
}
BENCHMARK(BM_GatherAllRanks)->Args({8, 100})->Args({64, 100})->Args({512, 100})->Args({2048, 50});

void BM_PlanSaveParts(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int shards = static_cast<int>(state.range(1));
  Operation op;
  op.world_size = world;
  op.ranks.resize(world);
  for (int r = 0; r < world; ++r) op.ranks[r].shards = RankPieces(RankShards(r, world, shards));
  for (auto _ : state) {
    auto plans = PlanSave(op);
    if (!plans.ok()) state.SkipWithError(std::string(plans.status().message()).c_str());
    benchmark::DoNotOptimize(plans);
  }
  state.SetItemsProcessed(state.iterations() * world * (shards + 1));
}
BENCHMARK(BM_PlanSaveParts)->Args({8, 100})->Args({64, 100})->Args({512, 100})->Args({2048, 50});

}  // namespace
}  // namespace ckpt::coordinator
