#include "sharding/reshard_plan.h"

#include <random>
#include <set>

#include "gtest/gtest.h"
#include "sharding/dtensor.h"
#include "sharding/flat_sharding.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using testing::HeldGlobalIndices;
using testing::Uniform;
using V = std::vector<int64_t>;

TensorPiece Piece(std::string key, int64_t rank, V shape, Region region, V replica = {},
                  DType dtype = DType::kF32) {
  return TensorPiece{std::move(key),    rank, dtype, std::move(shape), std::move(region),
                     std::move(replica)};
}

Region Box(V offsets, V lengths, std::optional<FlatRange> flat = std::nullopt) {
  return Region{std::move(offsets), std::move(lengths), flat};
}

// A DTensor layout of one tensor over a random mesh, optionally with ZeRO-style flat
// shards of each main box over the last mesh dim instead of replicas.
std::vector<TensorPiece> RandomLayout(std::mt19937_64& rng, const std::string& key, V shape,
                                      DType dtype) {
  std::vector<TensorPiece> pieces;
  const int kind = Uniform(rng, 0, 2);
  if (kind == 2) {  // flat tiling of the whole tensor with random cuts, random ranks
    const int64_t total = WholeRegion(shape).BoxElements();
    int64_t at = 0;
    for (int r = 0; at < total || r == 0; ++r) {
      const int64_t next = r >= 4 ? total : Uniform(rng, at, total);
      pieces.push_back(Piece(key, Uniform(rng, 0, 7), shape,
                             Box(V(shape.size(), 0), shape, FlatRange{at, next}), {}, dtype));
      at = next;
    }
    return pieces;
  }
  V mesh_shape(Uniform(rng, 1, 3));
  for (int64_t& m : mesh_shape) m = Uniform(rng, 1, 3);
  std::vector<Placement> placements;
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    if (shape.empty() || Uniform(rng, 0, 2) == 0) {
      placements.push_back(Placement::Replicate());
    } else {
      placements.push_back(Placement::Shard(Uniform(rng, 0, shape.size() - 1)));
    }
  }
  auto mesh = DeviceMesh::Create(mesh_shape);
  auto shards = ComputeAllLocalShards(shape, *mesh, placements);
  EXPECT_TRUE(shards.ok()) << shards.status();
  const bool zero = kind == 1 && !placements.back().is_shard();
  const int64_t dp = mesh_shape.back();
  for (int64_t r = 0; r < mesh->size(); ++r) {
    const LocalShard& s = (*shards)[r];
    if (!zero) {
      pieces.push_back(Piece(key, r, shape, s.region(), s.replica_id, dtype));
      continue;
    }
    // Flat-shard the box over the last (replicated) mesh dim; other replicated dims stay.
    V replica(s.replica_id.begin(), s.replica_id.end() - 1);
    auto spec = EvenFlatSharding(s.shape, dp);
    Region region = s.region();
    region.flat = spec->unsharded_flattened_offsets[r % dp][0];
    pieces.push_back(Piece(key, r, shape, region, replica, dtype));
  }
  return pieces;
}

// Global element g of a tensor, byte b: a pattern that differs across tensors and elements.
unsigned char Pattern(int tensor, int64_t g, int64_t b) {
  return (g * 131 + b * 7 + tensor) & 0xff;
}

TEST(ReshardPlanTest, RowSplitTwoToFour) {
  std::vector<TensorPiece> src = {Piece("w", 0, {8, 2}, Box({0, 0}, {4, 2})),
                                  Piece("w", 1, {8, 2}, Box({4, 0}, {4, 2}))};
  std::vector<TensorPiece> dst;
  for (int r = 0; r < 4; ++r) dst.push_back(Piece("w", r, {8, 2}, Box({2 * r, 0}, {2, 2})));
  ReshardPlanOptions options;
  options.with_runs = true;
  auto plan = PlanReshard(src, dst, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->transfers.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const ReshardTransfer& t = plan->transfers[r];
    EXPECT_EQ(t.dst_piece, r);
    EXPECT_EQ(t.src_piece, r / 2);
    EXPECT_EQ(plan->overlaps[t.overlap].runs, (std::vector<CopyRun>{{(r % 2) * 4, 0, 4}}));
  }
  EXPECT_EQ(plan->total_elements, 16);
  EXPECT_EQ(plan->local_elements, 4);  // only rank 0 wants rows it already holds
}

TEST(ReshardPlanTest, PrefersASameRegionReplicaOnTheDestinationRank) {
  // Source: rank 0 main, rank 1 replica of the whole tensor. Destination: rank 1 wants rows 2..4.
  std::vector<TensorPiece> src = {Piece("w", 0, {4}, Box({0}, {4}), {0}),
                                  Piece("w", 1, {4}, Box({0}, {4}), {1})};
  std::vector<TensorPiece> dst = {Piece("w", 1, {4}, Box({2}, {2}))};
  auto plan = PlanReshard(src, dst);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->transfers.size(), 1u);
  EXPECT_EQ(plan->transfers[0].src_piece, 1);
  EXPECT_EQ(plan->local_elements, 2);
  ReshardPlanOptions remote;
  remote.prefer_local = false;
  plan = PlanReshard(src, dst, remote);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->transfers[0].src_piece, 0);
  EXPECT_EQ(plan->local_elements, 0);
}

TEST(ReshardPlanTest, DestinationReplicasShareOneOverlap) {
  std::vector<TensorPiece> src = {Piece("w", 0, {4}, Box({0}, {4}))};
  std::vector<TensorPiece> dst;
  for (int r = 0; r < 5; ++r) dst.push_back(Piece("w", r, {4}, Box({0}, {4}), {r}));
  auto plan = PlanReshard(src, dst);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->overlaps.size(), 1u);
  EXPECT_EQ(plan->transfers.size(), 5u);
  EXPECT_EQ(plan->total_elements, 20);
}

TEST(ReshardPlanTest, ErrorsNameTheTensorAndRank) {
  std::vector<TensorPiece> src = {Piece("w", 0, {8}, Box({0}, {6}))};
  std::vector<TensorPiece> dst = {Piece("w", 3, {8}, Box({0}, {8}))};
  auto plan = PlanReshard(src, dst);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("tensor 'w'"), absl::string_view::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("[6, 8)"), absl::string_view::npos) << plan.status();

  src = {Piece("w", 0, {8}, Box({0}, {8}))};
  dst = {Piece("v", 2, {8}, Box({0}, {8}))};
  plan = PlanReshard(src, dst);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(plan.status().message().find("tensor 'v'"), absl::string_view::npos);

  dst = {Piece("w", 2, {8}, Box({0}, {8}), {}, DType::kBF16)};
  plan = PlanReshard(src, dst);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("rank 2 expects BF16"), absl::string_view::npos)
      << plan.status();

  dst = {Piece("w", 2, {8}, Box({4}, {5}))};
  plan = PlanReshard(src, dst);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

// Property test: random layouts of several tensors; the plan's (main source, destination)
// pairs equal the all-pairs brute force and executing it reproduces every element.
TEST(ReshardPlanTest, AgreesWithAllPairsAndReproducesEveryElement) {
  std::mt19937_64 rng(2026);
  for (int iter = 0; iter < 2000; ++iter) {
    const int num_tensors = Uniform(rng, 1, 3);
    std::vector<TensorPiece> src, dst;
    std::vector<V> shapes;
    for (int t = 0; t < num_tensors; ++t) {
      const std::string key = "t" + std::to_string(t);
      V shape = testing::RandomShape(rng, 3, 6);
      const DType dtype = kAllDTypes[Uniform(rng, 0, std::size(kAllDTypes) - 1)];
      shapes.push_back(shape);
      for (auto& p : RandomLayout(rng, key, shape, dtype)) src.push_back(std::move(p));
      for (auto& p : RandomLayout(rng, key, shape, dtype)) dst.push_back(std::move(p));
    }
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dst.begin(), dst.end(), rng);
    ReshardPlanOptions options;
    options.with_runs = Uniform(rng, 0, 1) == 1;
    options.prefer_local = Uniform(rng, 0, 1) == 1;
    auto plan = PlanReshard(src, dst, options);
    ASSERT_TRUE(plan.ok()) << plan.status();

    std::set<std::pair<int64_t, int64_t>> want, got;
    int64_t want_elements = 0;
    for (size_t j = 0; j < dst.size(); ++j) {
      for (size_t i = 0; i < src.size(); ++i) {
        if (src[i].key != dst[j].key || !src[i].is_main_replica()) continue;
        const int64_t n = *OverlapElements(src[i].region, dst[j].region, dst[j].global_shape);
        if (n > 0) {
          want.insert({i, j});
          want_elements += n;
        }
      }
    }
    for (const ReshardTransfer& t : plan->transfers) {
      const ReshardOverlap& o = plan->overlaps[t.overlap];
      ASSERT_TRUE(got.insert({o.src_main_piece, t.dst_piece}).second);
      ASSERT_EQ(src[t.src_piece].region, src[o.src_main_piece].region);
      ASSERT_EQ(dst[t.dst_piece].region, dst[o.dst_piece].region);
    }
    ASSERT_EQ(got, want);
    ASSERT_EQ(plan->total_elements, want_elements);

    // Execute on host buffers.
    auto tensor_of = [](const TensorPiece& p) { return std::stoi(p.key.substr(1)); };
    std::vector<std::vector<unsigned char>> sbuf(src.size()), dbuf(dst.size());
    std::vector<const void*> sptr;
    std::vector<void*> dptr;
    for (size_t i = 0; i < src.size(); ++i) {
      const int64_t es = DTypeSize(src[i].dtype);
      auto idx = HeldGlobalIndices(src[i].region, src[i].global_shape);
      sbuf[i].resize(idx.size() * es);
      for (size_t e = 0; e < idx.size(); ++e) {
        for (int64_t b = 0; b < es; ++b)
          sbuf[i][e * es + b] = Pattern(tensor_of(src[i]), idx[e], b);
      }
      sptr.push_back(sbuf[i].data());
    }
    for (size_t j = 0; j < dst.size(); ++j) {
      dbuf[j].assign(dst[j].region.NumElements() * DTypeSize(dst[j].dtype), 0xEE);
      dptr.push_back(dbuf[j].data());
    }
    ASSERT_TRUE(ApplyReshardPlan(*plan, src, dst, sptr, dptr).ok());
    for (size_t j = 0; j < dst.size(); ++j) {
      const int64_t es = DTypeSize(dst[j].dtype);
      auto idx = HeldGlobalIndices(dst[j].region, dst[j].global_shape);
      for (size_t e = 0; e < idx.size(); ++e) {
        for (int64_t b = 0; b < es; ++b) {
          ASSERT_EQ(dbuf[j][e * es + b], Pattern(tensor_of(dst[j]), idx[e], b))
              << "destination " << dst[j].key << " " << dst[j].DebugString() << " element " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
