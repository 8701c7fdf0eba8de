// The four exchange algorithms on N = 1..8 ranks as threads of this process over Gloo/TCP
// loopback, checked byte for byte against the single-process reference.
#include "exchange/exchange.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "exchange/exchange_testing.h"
#include "exchange/gloo/gloo_communicator.h"
#include "exchange/thread_group.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

struct RunResult {
  std::vector<absl::Status> statuses;
  std::vector<ShardBuffers> outputs;
  std::vector<ExchangeReport> reports;
};

RunResult RunExchange(const std::string& algorithm, const Scenario& sc, const ExchangeOptions& base,
                      const std::string& group) {
  const int n = sc.plan.num_ranks;
  RunResult result;
  result.outputs.resize(n);
  result.reports.resize(n);
  result.statuses = RunOnThreads(
      n, GlooMaker(group), absl::Seconds(30), [&](int rank, Communicator& comm) -> absl::Status {
        ExchangeOptions options = base;
        options.deadline = absl::Now() + absl::Seconds(30);
        auto out = ExchangeByDistribution(algorithm, comm, sc.plan, sc.loaded[rank], options,
                                          &result.reports[rank]);
        if (!out.ok()) return out.status();
        result.outputs[rank] = std::move(*out);
        return absl::OkStatus();
      });
  return result;
}

void ExpectMatchesReference(const Scenario& sc, const RunResult& result) {
  for (int r = 0; r < sc.plan.num_ranks; ++r) {
    ASSERT_TRUE(result.statuses[r].ok()) << "rank " << r << ": " << result.statuses[r];
    ShardBuffers expected = ReferenceOutputs(sc.plan, r);
    ASSERT_EQ(result.outputs[r].size(), expected.size()) << "rank " << r;
    for (const auto& [id, bytes] : expected) {
      auto it = result.outputs[r].find(id);
      ASSERT_NE(it, result.outputs[r].end()) << "rank " << r << " lacks " << id.DebugString();
      EXPECT_TRUE(it->second == bytes)
          << "rank " << r << " shard " << id.DebugString() << ": " << it->second.size()
          << " bytes differ from the reference's " << bytes.size() << " got "
          << absl::BytesToHexString(it->second.substr(0, 16)) << " want "
          << absl::BytesToHexString(bytes.substr(0, 16));
    }
  }
}

using Param = std::tuple<int, std::string>;

class ExchangeAlgorithmTest : public ::testing::TestWithParam<Param> {
 protected:
  int N() const { return std::get<0>(GetParam()); }
  const std::string& Algorithm() const { return std::get<1>(GetParam()); }
  std::string Group(absl::string_view what) const {
    return absl::StrCat(what, "_", Algorithm(), "_n", N());
  }
};

TEST_P(ExchangeAlgorithmTest, EveryRankGetsExactlyTheBytesItNeeds) {
  ScenarioOptions so;
  so.num_ranks = N();
  so.seed = 11;
  so.scale = 3;
  Scenario sc = MakeScenario(so);
  RunResult result = RunExchange(Algorithm(), sc, ExchangeOptions(), Group("ids"));
  ExpectMatchesReference(sc, result);
}

TEST_P(ExchangeAlgorithmTest, TinyBudgetSplitsIntoWavesWithIdenticalOutput) {
  ScenarioOptions so;
  so.num_ranks = N();
  so.seed = 5;
  so.scale = 9;
  Scenario sc = MakeScenario(so);
  ExchangeOptions options;
  options.memory_budget_bytes = 97;  // odd, smaller than many shards
  RunResult result = RunExchange(Algorithm(), sc, options, Group("tiny"));
  ExpectMatchesReference(sc, result);
  // Broadcast receives needed shards straight into the outputs (no staging), so only the
  // algorithms that stage everything they receive must have split into several waves.
  if (N() > 1 && Algorithm() != "broadcast") {
    for (int r = 0; r < N(); ++r) EXPECT_GT(result.reports[r].waves.size(), 1u) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, ExchangeAlgorithmTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values("broadcast", "gather_rounds",
                                                              "gather_object",
                                                              "overlap_all_to_all")),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(std::get<1>(info.param), "_N",
                                               std::get<0>(info.param));
                         });

class OverlapReshardTest : public ::testing::TestWithParam<int> {};

TEST_P(OverlapReshardTest, ReshardedRegionsArriveWithLowerBoundBytesOnTheWire) {
  const int n = GetParam();
  for (int64_t budget : {int64_t{1} << 30, int64_t{61}}) {
    ScenarioOptions so;
    so.num_ranks = n;
    so.seed = 3;
    so.scale = 5;
    so.reshard = true;
    Scenario sc = MakeScenario(so);
    ExchangeOptions options;
    options.memory_budget_bytes = budget;
    RunResult result =
        RunExchange("overlap_all_to_all", sc, options, absl::StrCat("reshard_n", n, "_b", budget));
    ExpectMatchesReference(sc, result);
    int64_t sent = 0, received = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(result.reports[r].bytes_received(), LowerBoundReceiveBytes(sc.plan, r))
          << "rank " << r << " budget " << budget;
      sent += result.reports[r].bytes_sent();
      received += result.reports[r].bytes_received();
    }
    EXPECT_EQ(sent, received);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, OverlapReshardTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

TEST(ExchangeBroadcastTest, CoalescingGivesTheSameOutputWithFewerCollectives) {
  ScenarioOptions so;
  so.num_ranks = 4;
  so.seed = 9;
  Scenario sc = MakeScenario(so);
  ExchangeOptions per_shard;
  per_shard.coalesce_max_shard_bytes = -1;  // nothing is small enough: one broadcast per shard
  RunResult a = RunExchange("broadcast", sc, per_shard, "coalesce_off");
  RunResult b = RunExchange("broadcast", sc, ExchangeOptions(), "coalesce_on");
  ExpectMatchesReference(sc, a);
  ExpectMatchesReference(sc, b);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a.outputs[r], b.outputs[r]);
    EXPECT_LT(b.reports[r].collectives(), a.reports[r].collectives());
    EXPECT_LE(b.reports[r].collectives(), 4);  // one coalesced broadcast per source rank
  }
}

TEST(ExchangeBroadcastTest, HundredThousandTinyShardsTakeAFewCoalescedCollectives) {
  const int n = 2, shards = 100000;
  Scenario sc;
  sc.plan.num_ranks = n;
  sc.plan.needs.resize(n);
  sc.loaded.resize(n);
  for (int i = 0; i < shards; ++i) {
    DistributedPiece d;
    d.spec.id.key = absl::StrCat("bias.", i);
    d.spec.dtype = i % 2 ? DType::kBF16 : DType::kF32;
    d.spec.global_shape = {i % 7};
    d.spec.region = WholeRegion(d.spec.global_shape);
    d.spec.id.offsets = {0};
    d.main_rank = i % n;
    sc.loaded[d.main_rank][d.spec.id] = ReferenceRegionBytes(d.spec);
    for (int r = 0; r < n; ++r) sc.plan.needs[r].push_back(d.spec);  // replicated everywhere
    sc.plan.distribution.push_back(std::move(d));
  }
  ExchangeOptions options;
  options.coalesce_max_batch_bytes = 256 << 10;
  RunResult result = RunExchange("broadcast", sc, options, "tiny100k");
  ExpectMatchesReference(sc, result);
  // ~1.3 MB of payload per root in 256 KiB batches: a handful of collectives, not 100,000.
  for (int r = 0; r < n; ++r) EXPECT_LE(result.reports[r].collectives(), 16) << "rank " << r;
}

TEST(ExchangeBroadcastTest, SingleHolderMustBeTheAssignedRank) {
  ScenarioOptions so;
  so.num_ranks = 2;
  Scenario sc = MakeScenario(so);
  // Make rank 1 the only rank needing a shard that rank 0 loaded.
  int victim = -1;
  for (int i = 0; i < static_cast<int>(sc.plan.distribution.size()); ++i) {
    if (sc.plan.distribution[i].main_rank == 0) victim = i;
  }
  ASSERT_GE(victim, 0);
  const PieceSpec spec = sc.plan.distribution[victim].spec;
  for (auto& needs : sc.plan.needs) {
    needs.erase(std::remove_if(needs.begin(), needs.end(),
                               [&](const PieceSpec& s) { return s.id == spec.id; }),
                needs.end());
  }
  sc.plan.needs[1].push_back(spec);
  RunResult result = RunExchange("broadcast", sc, ExchangeOptions(), "single_holder");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(result.statuses[r].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(result.statuses[r].message().find("needed only by rank 1"), std::string::npos)
        << result.statuses[r];
  }
}

TEST(ExchangeGatherObjectTest, ShardLoadedByTwoRanksIsAnErrorOnEveryRank) {
  ScenarioOptions so;
  so.num_ranks = 3;
  Scenario sc = MakeScenario(so);
  const auto& [id, bytes] = *sc.loaded[0].begin();
  sc.loaded[2][id] = bytes;
  RunResult result = RunExchange("gather_object", sc, ExchangeOptions(), "dup");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(result.statuses[r].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(result.statuses[r].message().find("loaded by both rank 0 and rank 2"),
              std::string::npos)
        << result.statuses[r];
  }
}

TEST(ExchangeByDistributionTest, UnknownAlgorithmListsTheValidNames) {
  ScenarioOptions so;
  Scenario sc = MakeScenario(so);
  RunResult result = RunExchange("all_reduce", sc, ExchangeOptions(), "unknown");
  EXPECT_EQ(result.statuses[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.statuses[0].message().find(
                "valid: broadcast, gather_rounds, gather_object, overlap_all_to_all"),
            std::string::npos)
      << result.statuses[0];
}

// A communicator that claims device memory; the algorithms must refuse it.
class DeviceKindCommunicator : public FaultInjectingCommunicator {
 public:
  using FaultInjectingCommunicator::FaultInjectingCommunicator;
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
};

TEST(ExchangeByDistributionTest, DeviceMemoryCommunicatorIsRefused) {
  ScenarioOptions so;
  Scenario sc = MakeScenario(so);
  InMemoryStore store;
  auto inner = CreateGlooCommunicator(&store, 0, 1, GlooOptions(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(inner.ok()) << inner.status();
  DeviceKindCommunicator device(std::move(*inner), -1, nullptr);
  absl::Status s =
      ExchangeByDistribution("broadcast", device, sc.plan, sc.loaded[0], ExchangeOptions())
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("device memory"), std::string::npos) << s;
}

TEST(ExchangeByDistributionTest, MissingLoadedShardIsNamed) {
  ScenarioOptions so;
  so.num_ranks = 2;
  Scenario sc = MakeScenario(so);
  sc.loaded[1].erase(sc.loaded[1].begin());
  RunResult result = RunExchange("broadcast", sc, ExchangeOptions(), "missing");
  EXPECT_EQ(result.statuses[1].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(result.statuses[1].message().find("rank 1 was assigned shard"), std::string::npos)
      << result.statuses[1];
}

TEST(ExchangeFaultTest, RankThatLeavesMidExchangeFailsEveryOtherRankWithinTheDeadline) {
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    ScenarioOptions so;
    so.num_ranks = 4;
    so.scale = 9;
    Scenario sc = MakeScenario(so);
    // Rank 3 takes part in two collectives, then leaves: its communicator is destroyed, which
    // closes its connections, exactly as when its process exits.
    CommunicatorMaker gloo = GlooMaker("leave_" + algorithm);
    CommunicatorMaker maker =
        [&](Store* store, int rank, int size,
            absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      auto comm = gloo(store, rank, size, deadline);
      if (!comm.ok() || rank != 3) return comm;
      return std::unique_ptr<Communicator>(new FaultInjectingCommunicator(
          std::move(*comm), 3, [](std::unique_ptr<Communicator>& inner) {
            inner.reset();
            return absl::AbortedError("rank 3 left on purpose");
          }));
    };
    absl::Time start = absl::Now();
    std::vector<absl::Status> statuses =
        RunOnThreads(4, maker, absl::Seconds(30), [&](int rank, Communicator& comm) {
          ExchangeOptions options;
          options.memory_budget_bytes = 256;  // many waves, so rank 3 leaves mid-way
          options.deadline = absl::Now() + absl::Seconds(4);
          return ExchangeByDistribution(algorithm, comm, sc.plan, sc.loaded[rank], options)
              .status();
        });
    EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << algorithm;
    EXPECT_EQ(statuses[3].code(), absl::StatusCode::kAborted) << algorithm << statuses[3];
    bool someone_names_rank_3 = false;
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(statuses[r].code() == absl::StatusCode::kUnavailable ||
                  statuses[r].code() == absl::StatusCode::kDeadlineExceeded)
          << algorithm << " rank " << r << ": " << statuses[r];
      EXPECT_NE(statuses[r].message().find("rank"), std::string::npos) << statuses[r];
      someone_names_rank_3 =
          someone_names_rank_3 || statuses[r].message().find("rank 3") != std::string::npos;
    }
    EXPECT_TRUE(someone_names_rank_3) << algorithm;
  }
}

}  // namespace
}  // namespace ckpt
