// Megatron-core's determine_main_replica_uniform_distribution over gathered per-rank shard
// metadata: which rank of a parallelization group saves (or loads) each shard.
#ifndef CKPT_PLANNER_MAIN_REPLICA_H_
#define CKPT_PLANNER_MAIN_REPLICA_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "sharding/piece_id.h"

namespace ckpt {

// One entry of a rank's gathered metadata: a shard it holds, its size in bytes, and whether
// this copy is the main replica (replica id all zeros).
struct RankShardInfo {
  PieceId id;
  int64_t size_bytes = 0;
  bool is_main = false;
};

// Megatron's ShardDistribution, minus the metadata dict (callers keep their own).
struct MainReplicaDistribution {
  // The chosen rank per distributed shard, in distribution (visiting) order.
  std::vector<std::pair<PieceId, int64_t>> main_rank_for_shard;
  // Shards this group is responsible for, sorted by id.
  std::vector<PieceId> shards_in_this_group;
  // Every group rank holding each distributed shard (rank order, repeats kept), sorted by id.
  std::vector<std::pair<PieceId, std::vector<int64_t>>> all_ranks_for_shard;
};

// `per_rank[r]` is rank r's list in its own order; `group_size` is the group's size (Megatron
// returns None, here nullopt, when it is <= 1; otherwise per_rank must have group_size lists,
// and group_size be at most kMaxWorldSize).
// Holders are appended in rank order, then list order, repeats kept; a shard's size comes
// from its first occurrence. Save mode (ignore_groups = false) distributes only shards with a
// main replica in the group; load mode (true) distributes every shard and those without a
// main replica in the group form the cross set (visited last).
// Sorting ids for the output lists orders a flat-less id before a flat one with the same key
// and offsets (where Python would raise TypeError); the distribution itself still reports
// such ties as errors, as Megatron does.
absl::StatusOr<std::optional<MainReplicaDistribution>> DetermineMainReplicaDistribution(
    const std::vector<std::vector<RankShardInfo>>& per_rank, int64_t group_size,
    bool ignore_groups);

}  // namespace ckpt

#endif  // CKPT_PLANNER_MAIN_REPLICA_H_
