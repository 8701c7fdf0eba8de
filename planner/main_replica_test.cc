#include "planner/main_replica.h"

#include <map>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/distribute.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

PieceId Id(std::string key, int64_t offset = 0) { return PieceId{std::move(key), {offset}, {}}; }

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

// Issue 11 finding 4: a group of 10^9 ranks is refused before anything per rank exists.
TEST(MainReplicaTest, HugeGroupIsAnError) {
  auto r = DetermineMainReplicaDistribution({}, 1000000000, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than the limit of 1048576 ranks"),
            absl::string_view::npos)
      << r.status();
}

TEST(MainReplicaTest, NoneVersusRangeTieIsReportedFromTheDistribution) {
  PieceId flat{"k", {0}, FlatRange{0, 2}};
  std::vector<std::vector<RankShardInfo>> per_rank = {{{Id("k"), 4, true}}, {{flat, 4, true}}};
  auto d = DetermineMainReplicaDistribution(per_rank, 2, false);
  EXPECT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("('k', (0,), (0, 2))"));
}

// Brute-force twin of Megatron's function: ordered maps, the straightforward distribution.
MainReplicaDistribution BruteForce(const std::vector<std::vector<RankShardInfo>>& per_rank,
                                   bool ignore_groups) {
  std::map<PieceId, std::vector<int64_t>, PieceIdLess> ranks;
  std::map<PieceId, int64_t, PieceIdLess> size;
  std::set<PieceId, PieceIdLess> main, non_main;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const RankShardInfo& info : per_rank[r]) {
      ranks[info.id].push_back(r);
      size.emplace(info.id, info.size_bytes);
      (info.is_main ? main : non_main).insert(info.id);
    }
  }
  DistributionInput input;
  input.num_ranks = per_rank.size();
  MainReplicaDistribution d;
  for (const auto& [id, holders] : ranks) {
    const bool in_group = main.count(id) || (ignore_groups && non_main.count(id));
    if (!in_group) continue;
    input.AddShard(id, size[id], holders, !main.count(id));
    d.shards_in_this_group.push_back(id);
    d.all_ranks_for_shard.emplace_back(id, holders);
  }
  auto assignment = DistributeShardsToRanksReference(input);
  EXPECT_TRUE(assignment.ok()) << assignment.status();
  for (const ShardAssignment& a : *assignment) {
    d.main_rank_for_shard.emplace_back(input.shards[a.shard].id, a.rank);
  }
  return d;
}

TEST(MainReplicaPropertyTest, MatchesBruteForceTwin) {
  std::mt19937_64 rng(3);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t n = pick(2, 9);
    std::vector<std::vector<RankShardInfo>> per_rank(n);
    for (auto& list : per_rank) {
      for (int i = 0, k = static_cast<int>(pick(0, 10)); i < k; ++i) {
        PieceId id{std::string(1, static_cast<char>('a' + pick(0, 4))), {pick(0, 2)}, {}};
        if (id.key[0] % 2 == 0) id.flat = FlatRange{0, pick(1, 3)};  // never mixed per key
        list.push_back(RankShardInfo{id, pick(0, 3) * 4, pick(0, 2) == 0});
      }
    }
    const bool ignore_groups = iter % 2 == 1;
    auto got = DetermineMainReplicaDistribution(per_rank, n, ignore_groups);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    const MainReplicaDistribution want = BruteForce(per_rank, ignore_groups);
    EXPECT_EQ((*got)->main_rank_for_shard, want.main_rank_for_shard) << "iteration " << iter;
    EXPECT_EQ((*got)->shards_in_this_group, want.shards_in_this_group) << "iteration " << iter;
    EXPECT_EQ((*got)->all_ranks_for_shard, want.all_ranks_for_shard) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace ckpt
