// Process groups: a job's ranks split into groups within which saves distribute their writes
// and loads choose readers and exchange (Megatron's `parallelization_group`, anemoi's
// `read_group_size`, one group per node). Today's behaviour is one group of every rank.
//
// A group structure is declared as a spec (the same text in the client options, ckptctl flags,
// the Python package and the layout JSON; docs/layout.md "Process groups"):
//   "job" or ""         one group of every rank (the default)
//   "per-node"          one group per host, from the hosts of the ranks' workers
//   "read-groups:K"     groups of K consecutive ranks (anemoi read_group_size = K)
//   "model-replica:K"   one group per model replica of K consecutive ranks (TP x PP = K): the
//                       same partition as read-groups:K
//   "data-parallel:K"   Megatron's data-parallel groups for a model-parallel size K: the ranks
//                       r with equal r mod K (the ranks holding replicas of the same shards)
//   "0,1;2,3"           explicit groups: rank lists separated by ';'
// Resolved, the groups must partition the ranks: every rank in [0, N) in exactly one group,
// no group empty, K >= 1 dividing N. Inside a group its ranks are in ascending order (as
// torch.distributed.new_group orders them): a rank's group rank is its index there.
//
// Pure: no gRPC, threads or logging.
#ifndef CKPT_PLANNER_PROCESS_GROUPS_H_
#define CKPT_PLANNER_PROCESS_GROUPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/main_replica.h"
#include "sharding/piece_id.h"

namespace ckpt {

// Resolved groups: each a list of global ranks, ascending; groups ordered by their first rank.
using ProcessGroups = std::vector<std::vector<int64_t>>;

// A declared group structure (see the header comment for the shapes).
struct ProcessGroupSpec {
  enum class Shape { kJob, kPerNode, kReadGroups, kModelReplica, kDataParallel, kExplicit };
  Shape shape = Shape::kJob;
  int64_t size = 0;                         // K of the sized shapes
  std::vector<std::vector<int64_t>> ranks;  // kExplicit, as written

  bool IsJob() const { return shape == Shape::kJob; }
};

// Parses the spec text; InvalidArgument naming the text and what is wrong (an unknown shape, a
// size that is not a positive integer, a rank that is not a non-negative integer, an empty
// group in an explicit list).
absl::StatusOr<ProcessGroupSpec> ParseProcessGroupSpec(absl::string_view text);

// The canonical text of `spec` ("job", "read-groups:4", "0,1;2,3", ...).
std::string ProcessGroupSpecText(const ProcessGroupSpec& spec);

// Checks that `groups` partition [0, world_size): InvalidArgument naming the group (by index)
// and rank for a rank outside the range, a rank in two groups (naming both), an empty group,
// and a rank in no group.
absl::Status ValidateProcessGroups(const ProcessGroups& groups, int64_t world_size);

// The groups of `spec` for `world_size` ranks. `host_of_rank` (one host per rank) is needed for
// per-node only (FailedPrecondition when it does not name every rank's host). Each group is
// sorted ascending, groups ordered by first rank; errors as ValidateProcessGroups, or naming
// the size that does not divide world_size.
absl::StatusOr<ProcessGroups> ResolveProcessGroups(const ProcessGroupSpec& spec, int64_t world_size,
                                                   absl::Span<const std::string> host_of_rank = {});

// One group per host, in order of each host's first rank.
ProcessGroups GroupsPerHost(absl::Span<const std::string> host_of_rank);

// For every rank, (group index, rank within the group).
std::vector<std::pair<int32_t, int64_t>> GroupOfRank(const ProcessGroups& groups,
                                                     int64_t world_size);

// One group's main-replica distribution as megatron-core computes it with that group as the
// parallelization group: `distribution` in group ranks (indices into `ranks`); nullopt for a
// group of one rank, as upstream.
struct GroupMainReplicas {
  std::vector<int64_t> ranks;
  std::optional<MainReplicaDistribution> distribution;
};

// DetermineMainReplicaDistribution per group of `groups` (validated against per_rank.size()),
// each over the lists of its own ranks.
absl::StatusOr<std::vector<GroupMainReplicas>> DetermineMainReplicasPerGroup(
    const std::vector<std::vector<RankShardInfo>>& per_rank, const ProcessGroups& groups,
    bool ignore_groups);

// Who writes each main replica when saving with `groups` (save mode, as Megatron's
// FullyParallelSaveStrategyWrapper with each group as its parallelization group): per group,
// the distribution's choice mapped to global ranks; a group of one rank writes its own main
// replicas. (shard id, global rank), group by group.
absl::StatusOr<std::vector<std::pair<PieceId, int64_t>>> MainReplicaWritersPerGroup(
    const std::vector<std::vector<RankShardInfo>>& per_rank, const ProcessGroups& groups);

// The same writers from save-mode distributions already computed (DetermineMainReplicasPerGroup
// with ignore_groups = false over the same per_rank).
std::vector<std::pair<PieceId, int64_t>> WritersOfGroups(
    const std::vector<std::vector<RankShardInfo>>& per_rank,
    const std::vector<GroupMainReplicas>& per_group);

}  // namespace ckpt

#endif  // CKPT_PLANNER_PROCESS_GROUPS_H_
