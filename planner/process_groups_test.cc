#include "planner/process_groups.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ProcessGroups Resolve(const std::string& text, int64_t world, std::vector<std::string> hosts = {}) {
  absl::StatusOr<ProcessGroupSpec> spec = ParseProcessGroupSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ProcessGroups> groups = ResolveProcessGroups(*spec, world, hosts);
  EXPECT_TRUE(groups.ok()) << groups.status();
  return groups.ok() ? *groups : ProcessGroups{};
}

absl::Status ResolveError(const std::string& text, int64_t world) {
  absl::StatusOr<ProcessGroupSpec> spec = ParseProcessGroupSpec(text);
  if (!spec.ok()) return spec.status();
  return ResolveProcessGroups(*spec, world).status();
}

TEST(ProcessGroupSpecTest, EveryShapeResolvesToItsPartition) {
  using G = ProcessGroups;
  EXPECT_EQ(Resolve("", 3), (G{{0, 1, 2}}));
  EXPECT_EQ(Resolve("job", 3), (G{{0, 1, 2}}));
  EXPECT_EQ(Resolve("read-groups:2", 6), (G{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(Resolve("model-replica:3", 6), (G{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(Resolve("data-parallel:2", 6), (G{{0, 2, 4}, {1, 3, 5}}));
  EXPECT_EQ(Resolve(" 3, 1 ; 2,0 ", 4), (G{{0, 2}, {1, 3}}));  // sorted, by first rank
  EXPECT_EQ(Resolve("per-node", 5, {"b", "a", "b", "c", "a"}), (G{{0, 2}, {1, 4}, {3}}));
}

TEST(ProcessGroupSpecTest, CanonicalTextRoundTrips) {
  for (const std::string text :
       {"job", "per-node", "read-groups:4", "model-replica:8", "data-parallel:2", "0,1;2,3"}) {
    absl::StatusOr<ProcessGroupSpec> spec = ParseProcessGroupSpec(text);
    ASSERT_TRUE(spec.ok()) << text;
    EXPECT_EQ(ProcessGroupSpecText(*spec), text);
  }
}

TEST(ProcessGroupSpecTest, MalformedSpecsAreRefusedNamingWhatIsWrong) {
  EXPECT_THAT(ParseProcessGroupSpec("groups:2").status().message(), HasSubstr("expected job"));
  EXPECT_THAT(ParseProcessGroupSpec("read-groups:0").status().message(),
              HasSubstr("positive integer"));
  EXPECT_THAT(ParseProcessGroupSpec("read-groups:x").status().message(),
              HasSubstr("positive integer"));
  EXPECT_THAT(ParseProcessGroupSpec("0,1;;2").status().message(), HasSubstr("group 1 is empty"));
  EXPECT_THAT(ParseProcessGroupSpec("0,-1").status().message(),
              HasSubstr("group 0: \"-1\" is not a rank"));
}

TEST(ProcessGroupSpecTest, GroupsThatDoNotPartitionTheRanksNameTheRankAndGroup) {
  EXPECT_THAT(ResolveError("0,1;2,9", 4).message(),
              HasSubstr("process group 1 names rank 9, outside the job's ranks [0, 4)"));
  EXPECT_THAT(ResolveError("0,1;1,2,3", 4).message(),
              HasSubstr("rank 1 is in process groups 0 and 1"));
  EXPECT_THAT(ResolveError("0,1,1;2,3", 4).message(),
              HasSubstr("process group 0 names rank 1 twice"));
  EXPECT_THAT(ResolveError("0,1;3", 4).message(), HasSubstr("rank 2 is in no process group"));
  EXPECT_THAT(ResolveError("read-groups:3", 8).message(),
              HasSubstr("the group size 3 does not divide the job's 8 ranks"));
  EXPECT_EQ(ResolveError("0;1;2;3;4", 4).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ProcessGroupSpec> per_node = ParseProcessGroupSpec("per-node");
  EXPECT_EQ(ResolveProcessGroups(*per_node, 2, {"a"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ProcessGroupSpecTest, GroupOfRankGivesGroupAndGroupRank) {
  const ProcessGroups groups = {{0, 2, 4}, {1, 3, 5}};
  const auto of = GroupOfRank(groups, 6);
  EXPECT_EQ(of[4], std::make_pair(0, int64_t{2}));
  EXPECT_EQ(of[1], std::make_pair(1, int64_t{0}));
}

// TP x DP ranks r = dp * tp_size + tp: tensors split on dim 0 over TP, replicated over DP with
// the main replica on dp = 0; a few replicated everywhere (main on rank 0) and one flat-sharded
// over every rank (every piece a main replica).
std::vector<TensorPiece> RandomMegatronLayout(std::mt19937_64& rng, int64_t tp, int64_t dp) {
  std::vector<TensorPiece> pieces;
  const int tensors = static_cast<int>(testing::Uniform(rng, 1, 6));
  for (int t = 0; t < tensors; ++t) {
    const std::string key = "layer" + std::to_string(t);
    const int64_t rows = tp * testing::Uniform(rng, 1, 4), cols = dp * testing::Uniform(rng, 1, 5);
    const int kind = static_cast<int>(testing::Uniform(rng, 0, 2));
    for (int64_t r = 0; r < tp * dp; ++r) {
      TensorPiece p;
      p.key = key;
      p.rank = r;
      p.global_shape = {rows, cols};
      if (kind == 0) {
        p.region = Region{{(r % tp) * (rows / tp), 0}, {rows / tp, cols}, std::nullopt};
        p.replica_id = {0, r / tp};
      } else if (kind == 1) {
        p.region = Region{{0, 0}, {rows, cols}, std::nullopt};
        p.replica_id = {r};
      } else {
        const int64_t n = rows * cols, world = tp * dp;
        p.region = Region{{0, 0}, {rows, cols}, FlatRange{n * r / world, n * (r + 1) / world}};
      }
      pieces.push_back(std::move(p));
    }
  }
  return pieces;
}

// A random partition of `world` ranks into 1..world groups.
ProcessGroups RandomPartition(std::mt19937_64& rng, int64_t world) {
  std::vector<int64_t> ranks(world);
  for (int64_t r = 0; r < world; ++r) ranks[r] = r;
  std::shuffle(ranks.begin(), ranks.end(), rng);
  const int64_t count = testing::Uniform(rng, 1, world);
  ProcessGroups groups(count);
  for (int64_t i = 0; i < world; ++i)
    groups[i < count ? i : testing::Uniform(rng, 0, count - 1)].push_back(ranks[i]);
  for (auto& g : groups) std::sort(g.begin(), g.end());
  return groups;
}

std::vector<std::vector<RankShardInfo>> PerRank(const std::vector<TensorPiece>& pieces,
                                                int64_t world) {
  std::vector<std::vector<RankShardInfo>> per_rank(world);
  for (const TensorPiece& p : pieces) {
    per_rank[p.rank].push_back(RankShardInfo{PieceId{p.key, p.region.offsets, p.region.flat},
                                             p.region.NumElements() * DTypeSize(p.dtype),
                                             p.is_main_replica()});
  }
  return per_rank;
}

// Property: with any partition, the save plan writes each main replica once, by a rank of the
// main replica's own group that holds it, and exactly where that group's own main-replica
// distribution (Megatron's, the group as parallelization group) puts it.
TEST(SaveWithGroupsTest, EachGroupDistributesItsOwnMainReplicasAsMegatronDoes) {
  std::mt19937_64 rng(16);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t tp = testing::Uniform(rng, 1, 4), dp = testing::Uniform(rng, 1, 4);
    const int64_t world = tp * dp;
    const std::vector<TensorPiece> pieces = RandomMegatronLayout(rng, tp, dp);
    ProcessGroups groups;
    switch (trial % 3) {
      case 0:
        groups = Resolve("data-parallel:" + std::to_string(tp), world);
        break;
      case 1:
        groups = Resolve("model-replica:" + std::to_string(tp), world);
        break;
      default:
        groups = RandomPartition(rng, world);
    }
    SavePlanOptions options;
    options.groups = groups;
    absl::StatusOr<SavePlan> plan = BuildSavePlan(pieces, world, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::map<std::pair<std::string, std::string>, int64_t> writer_of;  // (key, region) -> rank
    for (const WriterPlan& w : plan->writers) {
      for (const PlannedFile& f : w.files) {
        for (const PlannedPiece& p : f.pieces) {
          EXPECT_EQ(pieces[p.source_index].rank, w.rank);
          EXPECT_TRUE(
              writer_of.emplace(std::make_pair(p.key, p.region.DebugString()), w.rank).second);
        }
      }
    }
    // The twin: each group's distribution, called directly on that group's lists.
    const auto per_rank = PerRank(pieces, world);
    const auto group_of = GroupOfRank(groups, world);
    for (const ProcessGroups::value_type& group : groups) {
      std::vector<std::vector<RankShardInfo>> lists;
      for (int64_t r : group) lists.push_back(per_rank[r]);
      auto d = DetermineMainReplicaDistribution(lists, static_cast<int64_t>(group.size()), false);
      ASSERT_TRUE(d.ok());
      if (!d->has_value()) continue;
      for (const auto& [id, group_rank] : (*d)->main_rank_for_shard) {
        for (const TensorPiece& p : pieces) {
          if (p.key != id.key || p.region.offsets != id.offsets || p.region.flat != id.flat) {
            continue;
          }
          EXPECT_EQ(writer_of.at({p.key, p.region.DebugString()}), group[group_rank]);
          break;
        }
      }
    }
    int64_t mains = 0;
    for (const TensorPiece& p : pieces) {
      if (!p.is_main_replica()) continue;
      ++mains;
      const int64_t writer = writer_of.at({p.key, p.region.DebugString()});
      EXPECT_EQ(group_of[writer].first, group_of[p.rank].first) << "trial " << trial;
    }
    EXPECT_EQ(static_cast<int64_t>(writer_of.size()), mains);
  }
}

TEST(SaveWithGroupsTest, OneGroupOfEveryRankIsTheUngroupedPlan) {
  std::mt19937_64 rng(7);
  const std::vector<TensorPiece> pieces = RandomMegatronLayout(rng, 2, 3);
  SavePlanOptions grouped;
  grouped.groups = {{0, 1, 2, 3, 4, 5}};
  absl::StatusOr<SavePlan> a = BuildSavePlan(pieces, 6, grouped);
  absl::StatusOr<SavePlan> b = BuildSavePlan(pieces, 6);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->writers.size(), b->writers.size());
  for (size_t i = 0; i < a->writers.size(); ++i) {
    EXPECT_EQ(a->writers[i].rank, b->writers[i].rank);
    EXPECT_EQ(a->writers[i].total_bytes, b->writers[i].total_bytes);
  }
}

TEST(SaveWithGroupsTest, GroupsThatDoNotPartitionTheRanksAreRefused) {
  std::mt19937_64 rng(3);
  const std::vector<TensorPiece> pieces = RandomMegatronLayout(rng, 2, 2);
  SavePlanOptions options;
  options.groups = {{0, 1}, {2}};
  EXPECT_THAT(BuildSavePlan(pieces, 4, options).status().message(),
              HasSubstr("rank 3 is in no process group"));
}

// Megatron's ignore_groups: a piece only non-main requests need (its main replica is in
// another group) is a cross-group load, chosen after every other piece.
TEST(LoadWithGroupsTest, PiecesOnlyNonMainRequestsNeedAreVisitedLast) {
  std::vector<TensorMeta> tensors(2);
  tensors[0].key = "a";
  tensors[0].global_shape = {4};
  tensors[1].key = "b";
  tensors[1].global_shape = {4};
  std::vector<StoredPieceInfo> stored = {
      {"a", Region{{0}, {4}, std::nullopt}, "f", 0, 16},
      {"b", Region{{0}, {4}, std::nullopt}, "f", 16, 16},
  };
  // "a" has one holder (visited first by coverage), "b" two.
  std::vector<LoadRequest> requests = {{0, "a", Region{{0}, {4}, std::nullopt}},
                                       {0, "b", Region{{0}, {4}, std::nullopt}},
                                       {1, "b", Region{{0}, {4}, std::nullopt}}};
  LoadPlanOptions options;
  options.split_disjoint_reads = false;
  absl::StatusOr<LoadPlan> plain = BuildLoadPlan(tensors, stored, requests, 2, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->reader_of_piece,
              ElementsAre(std::make_pair(int64_t{0}, int64_t{0}), std::make_pair(1, 1)));
  requests[0].main_replica = false;  // "a": cross-group
  absl::StatusOr<LoadPlan> cross = BuildLoadPlan(tensors, stored, requests, 2, options);
  ASSERT_TRUE(cross.ok()) << cross.status();
  EXPECT_THAT(cross->reader_of_piece,
              ElementsAre(std::make_pair(int64_t{1}, int64_t{0}), std::make_pair(0, 0)));
}

}  // namespace
}  // namespace ckpt
