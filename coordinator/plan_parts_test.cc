#include "coordinator/plan_parts.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

// A wave's delivery as (unit, request, dst_rank), for comparisons.
using Triple = std::vector<int>;

std::vector<Triple> Deliveries(const pb::LoadWaveEntry& wave) {
  std::vector<Triple> out;
  for (const pb::LoadDeliveryEntry& d : wave.deliveries()) {
    out.push_back({d.unit(), d.request(), d.dst_rank()});
  }
  return out;
}

std::vector<int> Pieces(const pb::LoadWaveEntry& wave) {
  std::vector<int> out;
  for (const pb::LoadUnitEntry& u : wave.units()) out.push_back(u.piece());
  return out;
}

std::vector<std::string> Keys(const pb::LoadPlanPart& part) {
  std::vector<std::string> out;
  for (const pb::LoadRequestEntry& q : part.requests()) out.push_back(q.key());
  return out;
}

// Three ranks. Requests: rank 0 "q0"; rank 1 "q1", "q1b"; rank 2 "q2". Units (piece = index):
// u0 read by 0, delivered to 0 and 1; u1 read by 1, delivered to 1 and 2; u2 read by 2 for
// itself; u3 read by 1 for itself.
pb::LoadPlanPart WholePlan(pb::LoadAlgorithm algorithm) {
  pb::LoadPlanPart whole;
  whole.set_algorithm(algorithm);
  whole.set_world_size(3);
  whole.set_group("load/7");
  const std::vector<std::pair<int, std::string>> requests = {
      {0, "q0"}, {1, "q1"}, {1, "q1b"}, {2, "q2"}};
  for (const auto& [rank, key] : requests) {
    pb::LoadRequestEntry* q = whole.add_requests();
    q->set_rank(rank);
    q->set_key(key);
  }
  pb::LoadWaveEntry* wave = whole.add_waves();
  for (int reader : {0, 1, 2, 1}) {
    pb::LoadUnitEntry* u = wave->add_units();
    u->set_piece(wave->units_size() - 1);
    u->set_reader(reader);
  }
  const std::vector<Triple> deliveries = {{0, 0, 0}, {0, 1, 1}, {1, 2, 1},
                                          {1, 3, 2}, {2, 3, 2}, {3, 1, 1}};
  for (const Triple& t : deliveries) {
    pb::LoadDeliveryEntry* d = wave->add_deliveries();
    d->set_unit(t[0]);
    d->set_request(t[1]);
    d->set_dst_rank(t[2]);
  }
  return whole;
}

TEST(PlanPartsTest, BroadcastShareHasOwnRequestsAndEveryBroadcastUnitWithAWitness) {
  const pb::LoadPlanPart whole = WholePlan(pb::LOAD_BROADCAST);
  const PlanSplitter splitter(whole);
  const pb::LoadPlanPart zero = splitter.ShareOf(0);
  EXPECT_TRUE(zero.own_share());
  EXPECT_EQ(zero.group(), "load/7");
  EXPECT_EQ(Keys(zero), std::vector<std::string>{"q0"});
  ASSERT_EQ(zero.waves_size(), 1);
  // u0 (read here, broadcast to rank 1) and u1 (broadcast by rank 1 to rank 2); u2 and u3
  // stay with their readers and are no collective of anyone.
  EXPECT_EQ(Pieces(zero.waves(0)), (std::vector<int>{0, 1}));
  EXPECT_EQ(Deliveries(zero.waves(0)), (std::vector<Triple>{{0, 0, 0}, {0, -1, 1}, {1, -1, 2}}));

  const pb::LoadPlanPart two = splitter.ShareOf(2);
  EXPECT_EQ(Keys(two), std::vector<std::string>{"q2"});
  EXPECT_EQ(Pieces(two.waves(0)), (std::vector<int>{0, 1, 2}));
  // u1 and u2 come to its request; u0's witness; u1 needs none (rank 2 receives it itself).
  EXPECT_EQ(Deliveries(two.waves(0)), (std::vector<Triple>{{0, -1, 1}, {1, 0, 2}, {2, 0, 2}}));
}

TEST(PlanPartsTest, UnitsKeepTheirPositionAmongTheirReadersUnits) {
  const pb::LoadPlanPart one = PlanSplitter(WholePlan(pb::LOAD_BROADCAST)).ShareOf(1);
  EXPECT_EQ(Keys(one), (std::vector<std::string>{"q1", "q1b"}));
  ASSERT_EQ(Pieces(one.waves(0)), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(one.waves(0).units(0).reader_ordinal(), 0);  // rank 0's first
  EXPECT_EQ(one.waves(0).units(1).reader_ordinal(), 0);  // rank 1's first
  EXPECT_EQ(one.waves(0).units(2).reader_ordinal(), 1);  // rank 1's second
  EXPECT_EQ(Deliveries(one.waves(0)),
            (std::vector<Triple>{{0, 0, 1}, {1, 1, 1}, {1, -1, 2}, {2, 0, 1}}));
}

TEST(PlanPartsTest, GatherRoundsShareListsEveryUnitButOnlyItsOwnDeliveries) {
  const pb::LoadPlanPart zero = PlanSplitter(WholePlan(pb::LOAD_GATHER_ROUNDS)).ShareOf(0);
  EXPECT_EQ(Pieces(zero.waves(0)), (std::vector<int>{0, 1, 2, 3}));
  // Its own delivery, and the witness that u0, which it reads, leaves it.
  EXPECT_EQ(Deliveries(zero.waves(0)), (std::vector<Triple>{{0, 0, 0}, {0, -1, 1}}));
}

TEST(PlanPartsTest, GatherObjectShareListsOnlyUnitsItReadsOrReceives) {
  const pb::LoadPlanPart two = PlanSplitter(WholePlan(pb::LOAD_GATHER_OBJECT)).ShareOf(2);
  EXPECT_EQ(Pieces(two.waves(0)), (std::vector<int>{1, 2}));
  EXPECT_EQ(Deliveries(two.waves(0)), (std::vector<Triple>{{0, 0, 2}, {1, 0, 2}}));
}

TEST(PlanPartsTest, OverlapAllToAllShareCarriesTheRequestsOfTheRanksItSendsTo) {
  const pb::LoadPlanPart whole = WholePlan(pb::LOAD_OVERLAP_ALL_TO_ALL);
  const PlanSplitter splitter(whole);
  const pb::LoadPlanPart zero = splitter.ShareOf(0);
  EXPECT_TRUE(zero.own_share());
  // It reads u0 for itself and rank 1: it cuts what it sends by rank 1's request "q1".
  EXPECT_EQ(Keys(zero), (std::vector<std::string>{"q0", "q1"}));
  EXPECT_EQ(Pieces(zero.waves(0)), (std::vector<int>{0}));
  EXPECT_EQ(Deliveries(zero.waves(0)), (std::vector<Triple>{{0, 0, 0}, {0, 1, 1}}));
  // Rank 2 reads u2 for itself and receives u1: no unit of anyone else, no witness.
  const pb::LoadPlanPart two = splitter.ShareOf(2);
  EXPECT_EQ(Keys(two), std::vector<std::string>{"q2"});
  EXPECT_EQ(Pieces(two.waves(0)), (std::vector<int>{1, 2}));
  EXPECT_EQ(Deliveries(two.waves(0)), (std::vector<Triple>{{0, 0, 2}, {1, 0, 2}}));
}

TEST(PlanPartsTest, SharesAreSmallerThanTheWholePlan) {
  const pb::LoadPlanPart whole = WholePlan(pb::LOAD_BROADCAST);
  const PlanSplitter splitter(whole);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LT(splitter.ShareOf(r).ByteSizeLong(), whole.ByteSizeLong()) << "rank " << r;
  }
}

}  // namespace
}  // namespace ckpt::coordinator
