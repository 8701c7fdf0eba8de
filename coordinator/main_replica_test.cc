#include "coordinator/main_replica.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

ShardId Id(std::string key, int64_t offset = 0) { return ShardId{std::move(key), {offset}, {}}; }

TEST(MainReplicaTest, GroupOfOneOrZeroHasNoDistribution) {
  auto one = DetermineMainReplicaDistribution({{{Id("a"), 4, true}}}, 1, false);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->has_value());
  auto zero = DetermineMainReplicaDistribution({}, 0, true);
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(zero->has_value());
}

TEST(MainReplicaTest, SaveModeDistributesOnlyShardsWithMainReplicaInGroup) {
  // "a" is replicated on both ranks (main on rank 1); "b" has no main replica here.
  std::vector<std::vector<RankShardInfo>> per_rank = {
      {{Id("a"), 8, false}, {Id("b"), 100, false}},
      {{Id("a"), 8, true}, {Id("b"), 100, false}, {Id("c"), 2, true}},
  };
  auto d = DetermineMainReplicaDistribution(per_rank, 2, /*ignore_groups=*/false);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->has_value());
  // c (1 holder) first -> 1; a (2 holders): loads (0, 2) -> 0.
  EXPECT_THAT((*d)->main_rank_for_shard, ElementsAre(Pair(Id("c"), 1), Pair(Id("a"), 0)));
  EXPECT_THAT((*d)->shards_in_this_group, ElementsAre(Id("a"), Id("c")));
  EXPECT_THAT((*d)->all_ranks_for_shard,
              ElementsAre(Pair(Id("a"), ElementsAre(0, 1)), Pair(Id("c"), ElementsAre(1))));
}

TEST(MainReplicaTest, LoadModeDistributesAllAndVisitsCrossShardsLast) {
  std::vector<std::vector<RankShardInfo>> per_rank = {
      {{Id("a"), 8, false}, {Id("b"), 100, false}},
      {{Id("a"), 8, true}, {Id("b"), 100, false}, {Id("c"), 2, true}},
  };
  auto d = DetermineMainReplicaDistribution(per_rank, 2, /*ignore_groups=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->has_value());
  // Non-cross: c -> 1 (load 2), a -> 0 (load 8); cross b (no main here) last -> 1.
  EXPECT_THAT((*d)->main_rank_for_shard,
              ElementsAre(Pair(Id("c"), 1), Pair(Id("a"), 0), Pair(Id("b"), 1)));
  EXPECT_THAT((*d)->shards_in_this_group, ElementsAre(Id("a"), Id("b"), Id("c")));
}

TEST(MainReplicaTest, SizeComesFromFirstOccurrence) {
  // Rank 0 says 1 byte, rank 1 says 1000: the distribution uses 1.
  std::vector<std::vector<RankShardInfo>> per_rank = {
      {{Id("x"), 1, true}, {Id("y"), 5, true}},
      {{Id("x"), 1000, false}, {Id("y"), 5, false}},
  };
  auto d = DetermineMainReplicaDistribution(per_rank, 2, false);
  ASSERT_TRUE(d.ok());
  // y (5 bytes) before x (1 byte): y -> 0, x -> 1.
  EXPECT_THAT((*d)->main_rank_for_shard, ElementsAre(Pair(Id("y"), 0), Pair(Id("x"), 1)));
}

TEST(MainReplicaTest, RepeatedEntriesOnOneRankCountAsHolders) {
  // "x" listed twice on rank 0 has 3 holders; "y" has 2, so y is visited first.
  std::vector<std::vector<RankShardInfo>> per_rank = {
      {{Id("x"), 4, true}, {Id("x"), 4, false}, {Id("y"), 4, true}},
      {{Id("x"), 4, false}, {Id("y"), 4, false}},
  };
  auto d = DetermineMainReplicaDistribution(per_rank, 2, false);
  ASSERT_TRUE(d.ok());
  EXPECT_THAT((*d)->main_rank_for_shard, ElementsAre(Pair(Id("y"), 0), Pair(Id("x"), 1)));
  EXPECT_THAT((*d)->all_ranks_for_shard,
              ElementsAre(Pair(Id("x"), ElementsAre(0, 0, 1)), Pair(Id("y"), ElementsAre(0, 1))));
}

TEST(MainReplicaTest, MismatchedRankCountIsAnError) {
  auto d = DetermineMainReplicaDistribution({{}, {}}, 3, false);
  EXPECT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("3 ranks but 2"));
}

TEST(MainReplicaTest, NoneVersusRangeTieIsReportedFromTheDistribution) {
  ShardId flat{"k", {0}, FlatRange{0, 2}};
  std::vector<std::vector<RankShardInfo>> per_rank = {{{Id("k"), 4, true}}, {{flat, 4, true}}};
  auto d = DetermineMainReplicaDistribution(per_rank, 2, false);
  EXPECT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("('k', (0,), (0, 2))"));
}

}  // namespace
}  // namespace ckpt
