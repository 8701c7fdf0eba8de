#include "planner/main_replica.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/distribute.h"
#include "sharding/dtensor.h"

namespace ckpt {

absl::StatusOr<std::optional<MainReplicaDistribution>> DetermineMainReplicaDistribution(
    const std::vector<std::vector<RankShardInfo>>& per_rank, int64_t group_size,
    bool ignore_groups) {
  if (group_size <= 1) return std::optional<MainReplicaDistribution>();
  if (group_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", group_size, " ranks is more than the limit of ", kMaxWorldSize, " ranks"));
  }
  if (static_cast<int64_t>(per_rank.size()) != group_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("group of ", group_size, " ranks but ", per_rank.size(), " per-rank lists"));
  }
  // Every distinct shard in first-occurrence order, with Megatron's per-shard facts.
  struct Gathered {
    const PieceId* id;
    int64_t size;
    std::vector<int64_t> ranks;
    bool has_main = false;
    bool has_non_main = false;
  };
  std::vector<Gathered> gathered;
  // Keyed by the callers' ids (per_rank outlives this call): no id is copied per piece.
  absl::flat_hash_map<const PieceId*, int32_t, PieceIdPtrHash, PieceIdPtrEq> index;
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    for (const RankShardInfo& info : per_rank[rank]) {
      if (info.size_bytes < 0) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " reports shard ",
                                                       info.id.DebugString(),
                                                       " with negative size ", info.size_bytes));
      }
      auto [it, inserted] = index.try_emplace(&info.id, static_cast<int32_t>(gathered.size()));
      if (inserted) gathered.push_back(Gathered{&info.id, info.size_bytes, {}});
      Gathered& g = gathered[it->second];
      g.ranks.push_back(static_cast<int64_t>(rank));
      (info.is_main ? g.has_main : g.has_non_main) = true;
    }
  }

  DistributionInput input;
  input.num_ranks = group_size;
  std::vector<int32_t> in_group;  // indices into gathered
  for (size_t i = 0; i < gathered.size(); ++i) {
    Gathered& g = gathered[i];
    if (!(g.has_main || (ignore_groups && g.has_non_main))) continue;
    in_group.push_back(static_cast<int32_t>(i));
    // Cross set: in the group only because groups are ignored (no main replica here).
    input.AddShard(*g.id, g.size, g.ranks, /*cross_group=*/!g.has_main);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<ShardAssignment> assignment, DistributeShardsToRanks(input));

  MainReplicaDistribution result;
  result.main_rank_for_shard.reserve(assignment.size());
  for (const ShardAssignment& a : assignment) {
    result.main_rank_for_shard.emplace_back(input.shards[a.shard].id, a.rank);
  }
  std::sort(in_group.begin(), in_group.end(),
            [&](int32_t a, int32_t b) { return PieceIdLess()(*gathered[a].id, *gathered[b].id); });
  result.shards_in_this_group.reserve(in_group.size());
  result.all_ranks_for_shard.reserve(in_group.size());
  for (int32_t i : in_group) {
    result.shards_in_this_group.push_back(*gathered[i].id);
    result.all_ranks_for_shard.emplace_back(*gathered[i].id, std::move(gathered[i].ranks));
  }
  return std::optional<MainReplicaDistribution>(std::move(result));
}

}  // namespace ckpt
