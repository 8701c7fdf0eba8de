#include "planner/plan_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TensorPiece Piece(std::string key, int64_t rank, Region region, std::vector<int64_t> replica = {}) {
  TensorPiece p;
  p.key = std::move(key);
  p.rank = rank;
  p.dtype = DType::kF32;
  p.global_shape = {8};
  p.region = std::move(region);
  p.replica_id = std::move(replica);
  return p;
}

std::vector<TensorPiece> TwoRankLayout() {
  return {Piece("w", 0, Region{{0}, {4}, {}}), Piece("w", 1, Region{{4}, {4}, {}})};
}

TEST(PlanCacheTest, UnchangedLayoutReusesThePlan) {
  PlanCache cache;
  const auto pieces = TwoRankLayout();
  auto a = cache.GetSavePlan(pieces, 2);
  auto b = cache.GetSavePlan(pieces, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
}

TEST(PlanCacheTest, AnyChangeMissesAndGivesAFreshPlan) {
  PlanCache cache(16);
  const auto base = TwoRankLayout();
  auto first = cache.GetSavePlan(base, 2);
  ASSERT_TRUE(first.ok());

  auto moved = base;  // a different split of the same tensor
  moved[0].region = Region{{0}, {5}, {}};
  moved[1].region = Region{{5}, {3}, {}};
  auto plan = cache.GetSavePlan(moved, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->get(), first->get());
  EXPECT_EQ((*plan)->writers[0].total_bytes, 20);  // not the stale 16

  auto retyped = base;
  retyped[0].dtype = retyped[1].dtype = DType::kBF16;
  auto typed = cache.GetSavePlan(retyped, 2);
  ASSERT_TRUE(typed.ok());
  EXPECT_EQ((*typed)->writers[0].total_bytes, 8);

  SavePlanOptions small;
  small.target_file_bytes = 1;
  EXPECT_NE(cache.GetSavePlan(base, 2, small)->get(), first->get());
  EXPECT_NE(cache.GetSavePlan(base, 3)->get(), first->get());
  EXPECT_EQ(cache.hits(), 0);
  EXPECT_EQ(cache.GetSavePlan(base, 2)->get(), first->get());
  EXPECT_EQ(cache.hits(), 1);
}

TEST(PlanCacheTest, KeysSeparateFieldBoundaries) {
  // "ab" + "c" must not collide with "a" + "bc".
  std::vector<TensorPiece> x = {Piece("ab", 0, Region{{0}, {8}, {}}),
                                Piece("c", 0, Region{{0}, {8}, {}})};
  std::vector<TensorPiece> y = {Piece("a", 0, Region{{0}, {8}, {}}),
                                Piece("bc", 0, Region{{0}, {8}, {}})};
  EXPECT_NE(SavePlanKey(x, 1, {}), SavePlanKey(y, 1, {}));
  std::vector<TensorPiece> flat = {Piece("ab", 0, Region{{0}, {8}, FlatRange{0, 8}}),
                                   Piece("c", 0, Region{{0}, {8}, {}})};
  EXPECT_NE(SavePlanKey(x, 1, {}), SavePlanKey(flat, 1, {}));
}

TEST(PlanCacheTest, FailuresAreNotCachedAndLeastRecentlyUsedIsEvicted) {
  PlanCache cache(1);
  std::vector<TensorPiece> hole = {Piece("w", 0, Region{{0}, {4}, {}})};
  EXPECT_FALSE(cache.GetSavePlan(hole, 1).ok());
  EXPECT_FALSE(cache.GetSavePlan(hole, 1).ok());
  EXPECT_EQ(cache.misses(), 2);
  const auto a = TwoRankLayout();
  auto moved = a;
  moved[0].region = Region{{0}, {5}, {}};
  moved[1].region = Region{{5}, {3}, {}};
  auto pa = cache.GetSavePlan(a, 2);
  auto pb = cache.GetSavePlan(moved, 2);  // evicts a
  auto pa2 = cache.GetSavePlan(a, 2);
  ASSERT_TRUE(pa.ok() && pb.ok() && pa2.ok());
  EXPECT_NE(pa->get(), pa2->get());
  EXPECT_EQ(cache.hits(), 0);
}

TEST(PlanCacheTest, LoadPlansAreKeyedByRequestsToo) {
  PlanCache cache;
  std::vector<TensorMeta> tensors = {{"w", DType::kF32, {8}}};
  std::vector<StoredPieceInfo> pieces = {
      {"w", Region{{0}, {8}, {}}, "data/r0_0.safetensors", 0, 32}};
  std::vector<LoadRequest> requests = {{0, "w", Region{{0}, {4}, {}}},
                                       {1, "w", Region{{4}, {4}, {}}}};
  auto a = cache.GetLoadPlan(tensors, pieces, requests, 2);
  auto b = cache.GetLoadPlan(tensors, pieces, requests, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  requests[1].region = Region{{2}, {6}, {}};
  auto c = cache.GetLoadPlan(tensors, pieces, requests, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->get(), a->get());
  LoadPlanOptions broadcast;
  broadcast.algorithm = ExchangeAlgorithm::kBroadcast;
  auto d = cache.GetLoadPlan(tensors, pieces, requests, 2, broadcast);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->algorithm, ExchangeAlgorithm::kBroadcast);
  EXPECT_EQ(cache.hits(), 1);
}

}  // namespace
}  // namespace ckpt
