// The Into form of the exchange algorithms: results written into caller-provided destination
// buffers must equal the allocating form byte for byte, and bad destinations are refused with
// errors naming the shard and the rank.
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "exchange/exchange.h"
#include "exchange/exchange_testing.h"
#include "exchange/gloo/gloo_communicator.h"
#include "exchange/staging_arena.h"
#include "exchange/thread_group.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Destination memory for one rank: one buffer per need, pre-filled with a poison byte so a
// byte the exchange forgets to write shows up.
struct Destinations {
  ShardBuffers storage;
  DestinationBuffers views;
};

Destinations PoisonedDestinations(const ExchangePlan& plan, int rank) {
  Destinations d;
  for (const PieceSpec& need : plan.needs[rank]) {
    d.storage[need.id] = std::string(need.NumBytes(), '\xAB');
  }
  d.views = DestinationsOf(d.storage);
  return d;
}

absl::StatusOr<std::unique_ptr<Communicator>> SingleRank(const std::string& group) {
  InMemoryStore* store = new InMemoryStore();  // outlives the communicator (test process)
  GlooOptions options;
  options.group_name = group;
  return CreateGlooCommunicator(store, 0, 1, options, absl::Now() + absl::Seconds(10));
}

using Param = std::tuple<int, std::string>;

class ExchangeIntoTest : public ::testing::TestWithParam<Param> {
 protected:
  int N() const { return std::get<0>(GetParam()); }
  const std::string& Algorithm() const { return std::get<1>(GetParam()); }
};

TEST_P(ExchangeIntoTest, WritesTheSameBytesAsTheAllocatingFormIntoEveryDestination) {
  ScenarioOptions so;
  so.num_ranks = N();
  so.seed = 17;
  so.scale = 4;
  so.reshard = Algorithm() == "overlap_all_to_all";
  Scenario sc = MakeScenario(so);
  std::vector<ShardBuffers> allocated(N());
  std::vector<Destinations> into(N());
  for (int r = 0; r < N(); ++r) into[r] = PoisonedDestinations(sc.plan, r);
  std::vector<absl::Status> statuses = RunOnThreads(
      N(), GlooMaker(absl::StrCat("into_", Algorithm(), N())), absl::Seconds(30),
      [&](int rank, Communicator& comm) -> absl::Status {
        ExchangeOptions options;
        options.deadline = absl::Now() + absl::Seconds(30);
        auto out = ExchangeByDistribution(Algorithm(), comm, sc.plan, sc.loaded[rank], options);
        if (!out.ok()) return out.status();
        allocated[rank] = std::move(*out);
        // Twice through one caller-owned arena (tiny budget: many waves), so reused staging
        // with stale contents must not leak into the results.
        StagingArena arena;
        options.staging = &arena;
        options.memory_budget_bytes = 211;
        for (int pass = 0; pass < 2; ++pass) {
          absl::Status s = ExchangeByDistributionInto(Algorithm(), comm, sc.plan, sc.loaded[rank],
                                                      into[rank].views, options);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < N(); ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(into[r].storage, allocated[r]) << "rank " << r;
    EXPECT_EQ(into[r].storage, ReferenceOutputs(sc.plan, r)) << "rank " << r;
  }
}

TEST_P(ExchangeIntoTest, StagingStaysWithinTheBudgetWhenTheBudgetBinds) {
  if (N() == 1) GTEST_SKIP() << "one rank stages nothing";
  constexpr int64_t kBudget = 8192;  // two pages: the arena maps whole pages
  ScenarioOptions so;
  so.num_ranks = N();
  so.seed = 23;
  so.scale = 64;
  so.reshard = Algorithm() == "overlap_all_to_all";
  Scenario sc = MakeScenario(so);
  std::vector<Destinations> into(N());
  for (int r = 0; r < N(); ++r) into[r] = PoisonedDestinations(sc.plan, r);
  std::vector<size_t> capacity(N(), 0);
  std::vector<ExchangeReport> reports(N());
  std::vector<absl::Status> statuses = RunOnThreads(
      N(), GlooMaker(absl::StrCat("into_budget_", Algorithm(), N())), absl::Seconds(30),
      [&](int rank, Communicator& comm) -> absl::Status {
        StagingArena arena;
        ExchangeOptions options;
        options.deadline = absl::Now() + absl::Seconds(30);
        options.memory_budget_bytes = kBudget;
        options.staging = &arena;
        absl::Status s = ExchangeByDistributionInto(Algorithm(), comm, sc.plan, sc.loaded[rank],
                                                    into[rank].views, options, &reports[rank]);
        capacity[rank] = arena.capacity();
        return s;
      });
  int64_t most = 0;
  for (int r = 0; r < N(); ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(into[r].storage, ReferenceOutputs(sc.plan, r)) << "rank " << r;
    EXPECT_LE(capacity[r], static_cast<size_t>(kBudget)) << "rank " << r;
    most = std::max(most, reports[r].bytes_received());
  }
  EXPECT_GT(most, kBudget) << "scenario too small for the budget to bind";
  // ... and the staging did come from the caller's arena.
  EXPECT_GT(*std::max_element(capacity.begin(), capacity.end()), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, ExchangeIntoTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5),
                                            ::testing::Values("broadcast", "gather_rounds",
                                                              "gather_object",
                                                              "overlap_all_to_all")),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(std::get<1>(info.param), "_N",
                                               std::get<0>(info.param));
                         });

// A one-rank scenario and its destinations, for the argument checks (no peer can hang).
struct OneRank {
  Scenario sc;
  Destinations dst;
};

OneRank MakeOneRank() {
  ScenarioOptions so;
  so.num_ranks = 1;
  so.scale = 2;
  OneRank o;
  o.sc = MakeScenario(so);
  o.dst = PoisonedDestinations(o.sc.plan, 0);
  return o;
}

// The first need with at least one byte.
const PieceSpec& NonEmptyNeed(const ExchangePlan& plan) {
  for (const PieceSpec& s : plan.needs[0]) {
    if (s.NumBytes() > 0) return s;
  }
  return plan.needs[0].front();
}

TEST(ExchangeIntoArgumentsTest, WrongSizeDestinationIsRefusedNamingShardAndRank) {
  auto comm = SingleRank("into_wrong_size");
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    OneRank o = MakeOneRank();
    const PieceSpec& need = NonEmptyNeed(o.sc.plan);
    absl::Span<char>& view = o.dst.views.at(need.id);
    view = view.subspan(0, view.size() - 1);
    absl::Status s = ExchangeByDistributionInto(algorithm, **comm, o.sc.plan, o.sc.loaded[0],
                                                o.dst.views, ExchangeOptions());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << algorithm << s;
    EXPECT_NE(s.message().find(absl::StrCat("rank 0's destination buffer for shard ",
                                            need.id.DebugString(), " holds ", need.NumBytes() - 1,
                                            " bytes")),
              std::string::npos)
        << algorithm << s;
  }
}

TEST(ExchangeIntoArgumentsTest, MissingDestinationIsRefusedNamingShardAndRank) {
  auto comm = SingleRank("into_missing");
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    OneRank o = MakeOneRank();
    const PieceSpec& need = NonEmptyNeed(o.sc.plan);
    o.dst.views.erase(need.id);
    absl::Status s = ExchangeByDistributionInto(algorithm, **comm, o.sc.plan, o.sc.loaded[0],
                                                o.dst.views, ExchangeOptions());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << algorithm << s;
    EXPECT_NE(s.message().find(absl::StrCat("rank 0 has no destination buffer for shard ",
                                            need.id.DebugString())),
              std::string::npos)
        << algorithm << s;
  }
}

TEST(ExchangeIntoArgumentsTest, DestinationForAShardNotNeededIsRefused) {
  auto comm = SingleRank("into_extra");
  ASSERT_TRUE(comm.ok()) << comm.status();
  OneRank o = MakeOneRank();
  PieceId stray{"not.needed", {0}, std::nullopt};
  std::string memory(8, '\0');
  o.dst.views[stray] = absl::Span<char>(memory.data(), memory.size());
  absl::Status s = ExchangeByDistributionInto("overlap_all_to_all", **comm, o.sc.plan,
                                              o.sc.loaded[0], o.dst.views, ExchangeOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::StrCat("rank 0 was given a destination buffer for shard ",
                                          stray.DebugString(), " which it does not need")),
            std::string::npos)
      << s;
}

TEST(ExchangeIntoArgumentsTest, OverlappingDestinationsAreRefused) {
  auto comm = SingleRank("into_overlap");
  ASSERT_TRUE(comm.ok()) << comm.status();
  OneRank o = MakeOneRank();
  // Point two non-empty destinations at the same memory.
  std::vector<PieceId> non_empty;
  for (const PieceSpec& s : o.sc.plan.needs[0]) {
    if (s.NumBytes() > 0) non_empty.push_back(s.id);
  }
  ASSERT_GE(non_empty.size(), 2u);
  absl::Span<char> first = o.dst.views.at(non_empty[0]);
  absl::Span<char>& second = o.dst.views.at(non_empty[1]);
  std::string shared(std::max(first.size(), second.size()), '\0');
  o.dst.views.at(non_empty[0]) = absl::Span<char>(shared.data(), first.size());
  second = absl::Span<char>(shared.data(), second.size());
  absl::Status s = ExchangeByDistributionInto("broadcast", **comm, o.sc.plan, o.sc.loaded[0],
                                              o.dst.views, ExchangeOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("overlaps the destination buffer of shard"), std::string::npos) << s;
}

TEST(ExchangeIntoArgumentsTest, LoadedBufferOfAnotherShardIsNotADestination) {
  auto comm = SingleRank("into_alias_other");
  ASSERT_TRUE(comm.ok()) << comm.status();
  OneRank o = MakeOneRank();
  // Find two different non-empty shards with room: write one's destination over the other's
  // loaded bytes.
  const PieceSpec& need = NonEmptyNeed(o.sc.plan);
  std::string* other = nullptr;
  for (auto& [id, bytes] : o.sc.loaded[0]) {
    if (!(id == need.id) && static_cast<int64_t>(bytes.size()) >= need.NumBytes()) other = &bytes;
  }
  ASSERT_NE(other, nullptr);
  o.dst.views.at(need.id) = absl::Span<char>(other->data(), need.NumBytes());
  absl::Status s = ExchangeByDistributionInto("gather_rounds", **comm, o.sc.plan, o.sc.loaded[0],
                                              o.dst.views, ExchangeOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("overlaps the loaded buffer of shard"), std::string::npos) << s;
}

TEST(ExchangeIntoArgumentsTest, LoadedBufferOfTheSameShardMayBeItsDestination) {
  auto comm = SingleRank("into_alias_self");
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    OneRank o = MakeOneRank();
    ShardBuffers expected = ReferenceOutputs(o.sc.plan, 0);
    for (auto& [id, bytes] : o.sc.loaded[0]) {
      auto it = o.dst.views.find(id);
      if (it != o.dst.views.end()) it->second = absl::Span<char>(bytes.data(), bytes.size());
    }
    absl::Status s = ExchangeByDistributionInto(algorithm, **comm, o.sc.plan, o.sc.loaded[0],
                                                o.dst.views, ExchangeOptions());
    ASSERT_TRUE(s.ok()) << algorithm << s;
    for (const auto& [id, view] : o.dst.views) {
      EXPECT_EQ(std::string(view.data(), view.size()), expected.at(id))
          << algorithm << " " << id.DebugString();
    }
  }
}

TEST(ExchangeIntoTest, ZeroByteShardsTakeEmptyDestinationsOnEveryAlgorithm) {
  // Two tensors: one with no elements, one tiny, each stored on one of two ranks and needed
  // by both.
  Scenario sc;
  sc.plan.num_ranks = 2;
  sc.plan.needs.resize(2);
  sc.loaded.resize(2);
  for (int i = 0; i < 2; ++i) {
    DistributedPiece d;
    d.spec.id.key = i == 0 ? "empty" : "tiny";
    d.spec.dtype = DType::kF32;
    d.spec.global_shape = {i == 0 ? 0 : 3};
    d.spec.region = WholeRegion(d.spec.global_shape);
    d.spec.id.offsets = {0};
    d.main_rank = i;
    sc.loaded[i][d.spec.id] = ReferenceRegionBytes(d.spec);
    for (int r = 0; r < 2; ++r) sc.plan.needs[r].push_back(d.spec);
    sc.plan.distribution.push_back(std::move(d));
  }
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    std::vector<Destinations> into(2);
    for (int r = 0; r < 2; ++r) {
      into[r] = PoisonedDestinations(sc.plan, r);
      into[r].views.begin()->second = absl::Span<char>();  // "empty": null data, 0 bytes
    }
    std::vector<absl::Status> statuses =
        RunOnThreads(2, GlooMaker("into_zero_" + algorithm), absl::Seconds(30),
                     [&](int rank, Communicator& comm) -> absl::Status {
                       ExchangeOptions options;
                       options.deadline = absl::Now() + absl::Seconds(30);
                       return ExchangeByDistributionInto(algorithm, comm, sc.plan, sc.loaded[rank],
                                                         into[rank].views, options);
                     });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << algorithm << " rank " << r << ": " << statuses[r];
      EXPECT_EQ(into[r].storage, ReferenceOutputs(sc.plan, r)) << algorithm << " rank " << r;
    }
  }
}

TEST(StagingArenaTest, GrowsOnDemandAndKeepsItsBlockForSmallerRequests) {
  StagingArena arena;
  auto a = arena.Reserve(100);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GE(arena.capacity(), 100u);
  std::memset(*a, 1, 100);
  auto b = arena.Reserve(50);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  auto big = arena.Reserve(size_t{5} << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GE(arena.capacity(), size_t{5} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*big) % (size_t{2} << 20), 0u);  // huge-page aligned
  std::memset(*big, 2, size_t{5} << 20);
  arena.Release();
  EXPECT_EQ(arena.capacity(), 0u);
}

TEST(StagingArenaPoolTest, ASecondLeaseGetsTheFirstLeasesBlockWithoutMappingAgain) {
  StagingArenaPool pool(int64_t{64} << 20);
  char* first = nullptr;
  {
    StagingArenaPool::Lease lease = pool.Acquire();
    auto block = lease->Reserve(size_t{8} << 20);
    ASSERT_TRUE(block.ok()) << block.status();
    first = *block;
    std::memset(first, 1, size_t{8} << 20);
  }
  EXPECT_EQ(pool.stats().mappings, 1);
  EXPECT_EQ(pool.stats().idle_bytes, int64_t{8} << 20);
  {
    StagingArenaPool::Lease lease = pool.Acquire();
    auto block = lease->Reserve(size_t{4} << 20);
    ASSERT_TRUE(block.ok()) << block.status();
    EXPECT_EQ(*block, first);
  }
  const StagingPoolStats stats = pool.stats();
  EXPECT_EQ(stats.arenas, 1);
  EXPECT_EQ(stats.leases, 2);
  EXPECT_EQ(stats.mappings, 1);
}

TEST(StagingArenaPoolTest, LeasesHeldAtOnceGetTheirOwnArenas) {
  StagingArenaPool pool(int64_t{64} << 20);
  StagingArenaPool::Lease a = pool.Acquire();
  StagingArenaPool::Lease b = pool.Acquire();
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(pool.stats().arenas, 2);
}

TEST(StagingArenaPoolTest, ArenasReturnedPastTheIdleBoundAreUnmapped) {
  StagingArenaPool pool(int64_t{4} << 20);
  {
    StagingArenaPool::Lease a = pool.Acquire();
    StagingArenaPool::Lease b = pool.Acquire();
    ASSERT_TRUE(a->Reserve(size_t{4} << 20).ok());
    ASSERT_TRUE(b->Reserve(size_t{4} << 20).ok());
  }
  const StagingPoolStats stats = pool.stats();
  EXPECT_EQ(stats.idle_bytes, int64_t{4} << 20);
  EXPECT_EQ(stats.releases, 1);
}

TEST(ShardBufferPoolTest, ATakeAfterAGiveGetsTheSameMemoryBack) {
  ShardBufferPool pool(int64_t{1} << 20);
  std::string first = pool.Take(100000);
  ASSERT_EQ(first.size(), 100000u);
  const char* memory = first.data();
  pool.Give(std::move(first));
  std::string second = pool.Take(60000);  // smaller: served by the idle buffer
  EXPECT_EQ(second.size(), 60000u);
  EXPECT_EQ(second.data(), memory);
  const ShardBufferPoolStats stats = pool.stats();
  EXPECT_EQ(stats.allocated, 1);
  EXPECT_EQ(stats.reused, 1);
  EXPECT_EQ(stats.idle_bytes, 0);
}

TEST(ShardBufferPoolTest, TheSmallestIdleBufferThatFitsIsTakenAndLargerNeedsAllocate) {
  ShardBufferPool pool(int64_t{1} << 20);
  std::string small = pool.Take(10000), large = pool.Take(200000);
  const char* large_memory = large.data();
  pool.Give(std::move(small));
  pool.Give(std::move(large));
  std::string mid = pool.Take(50000);
  EXPECT_EQ(mid.data(), large_memory);
  std::string huge = pool.Take(300000);
  EXPECT_EQ(huge.size(), 300000u);
  EXPECT_EQ(pool.stats().allocated, 3);
}

TEST(ShardBufferPoolTest, BuffersGivenBackPastTheIdleBoundAreFreed) {
  ShardBufferPool pool(150000);
  std::string a = pool.Take(100000), b = pool.Take(100000);
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  const ShardBufferPoolStats stats = pool.stats();
  EXPECT_EQ(stats.dropped, 1);
  EXPECT_GE(stats.idle_bytes, 100000);
  EXPECT_LE(stats.idle_bytes, 150000);
}

}  // namespace
}  // namespace ckpt
