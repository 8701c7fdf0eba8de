#include "sharding/dtensor.h"

#include <map>
#include <random>

#include "gtest/gtest.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using testing::Uniform;
using V = std::vector<int64_t>;

DeviceMesh Mesh(V shape) {
  auto mesh = DeviceMesh::Create(std::move(shape));
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *mesh;
}

LocalShard Local(V global_shape, V mesh_shape, std::vector<Placement> placements, int64_t rank) {
  auto shard = ComputeLocalShard(global_shape, Mesh(mesh_shape), placements, rank);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *shard : LocalShard{};
}

TEST(DeviceMeshTest, RanksAreRowMajor) {
  DeviceMesh mesh = Mesh({2, 3, 4});
  EXPECT_EQ(mesh.size(), 24);
  EXPECT_EQ(*mesh.Coordinate(0), (V{0, 0, 0}));
  EXPECT_EQ(*mesh.Coordinate(5), (V{0, 1, 1}));
  EXPECT_EQ(*mesh.Coordinate(23), (V{1, 2, 3}));
  for (int64_t r = 0; r < mesh.size(); ++r) EXPECT_EQ(*mesh.Rank(*mesh.Coordinate(r)), r);
}

TEST(DeviceMeshTest, InvalidMeshesRanksAndCoordinatesAreErrors) {
  EXPECT_FALSE(DeviceMesh::Create({2, 0}).ok());
  EXPECT_FALSE(DeviceMesh::Create({-1}).ok());
  EXPECT_FALSE(DeviceMesh::Create({int64_t{1} << 40, int64_t{1} << 40}).ok());
  // The world size is bounded (kMaxWorldSize) before anything per rank exists; products of
  // dims that would overflow int64 are refused too.
  EXPECT_TRUE(DeviceMesh::Create({kMaxWorldSize}).ok());
  EXPECT_TRUE(DeviceMesh::Create({1024, 1024}).ok());
  absl::StatusOr<DeviceMesh> big = DeviceMesh::Create({1024, 1025});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than the limit of 1048576 ranks"),
            absl::string_view::npos)
      << big.status();
  EXPECT_FALSE(DeviceMesh::Create({int64_t{1} << 31}).ok());
  EXPECT_FALSE(DeviceMesh::Create({int64_t{1} << 62, int64_t{1} << 62, 4}).ok());
  EXPECT_FALSE(DeviceMesh::Create({INT64_MAX, INT64_MAX}).ok());
  DeviceMesh mesh = Mesh({2, 4});
  EXPECT_FALSE(mesh.Coordinate(8).ok());
  EXPECT_FALSE(mesh.Coordinate(-1).ok());
  EXPECT_FALSE(mesh.Rank({2, 0}).ok());
  EXPECT_FALSE(mesh.Rank({0}).ok());
}

TEST(DeviceMeshTest, ZeroDimMeshHasOneRank) {
  DeviceMesh mesh = Mesh({});
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_EQ(*mesh.Coordinate(0), V{});
}

TEST(TorchChunkTest, MatchesTorchChunk) {
  // torch.chunk(torch.arange(5), 2) -> [0,1,2], [3,4]
  EXPECT_EQ(TorchChunk(5, 2, 0).offset, 0);
  EXPECT_EQ(TorchChunk(5, 2, 0).size, 3);
  EXPECT_EQ(TorchChunk(5, 2, 1).offset, 3);
  EXPECT_EQ(TorchChunk(5, 2, 1).size, 2);
  // torch.chunk(torch.arange(5), 4) -> [0,1], [2,3], [4], and a fourth, empty chunk
  EXPECT_EQ(TorchChunk(5, 4, 2).size, 1);
  EXPECT_EQ(TorchChunk(5, 4, 3).size, 0);
  EXPECT_EQ(TorchChunk(5, 4, 3).offset, 5);
  EXPECT_EQ(TorchChunk(0, 3, 0).size, 0);
  // No overflow near 2^62.
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(TorchChunk(big, 3, 2).offset + TorchChunk(big, 3, 2).size, big);
}

// The PyTorch examples of issue 2.
TEST(DTensorTest, TwoMeshDimsShardingDimZeroGiveOneRowEach) {
  for (int64_t r = 0; r < 8; ++r) {
    LocalShard s = Local({8, 4}, {2, 4}, {Placement::Shard(0), Placement::Shard(0)}, r);
    EXPECT_EQ(s.shape, (V{1, 4})) << "rank " << r;
    EXPECT_EQ(s.offset, (V{r, 0})) << "rank " << r;
    EXPECT_TRUE(s.replica_id.empty());
  }
}

TEST(DTensorTest, LaterMeshDimSplitsTheEarlierChunkAgain) {
  const std::vector<V> shapes = {{2, 2}, {2, 1}, {2, 1}, {2, 1}};
  const std::vector<V> offsets = {{0, 0}, {0, 2}, {0, 3}, {0, 4}};
  for (int64_t r = 0; r < 4; ++r) {
    LocalShard s = Local({2, 5}, {2, 2}, {Placement::Shard(1), Placement::Shard(1)}, r);
    EXPECT_EQ(s.shape, shapes[r]) << "rank " << r;
    EXPECT_EQ(s.offset, offsets[r]) << "rank " << r;
  }
}

TEST(DTensorTest, EmptyShardsHaveTheGlobalSizeAsOffset) {
  for (int64_t r = 0; r < 8; ++r) {
    LocalShard s = Local({2}, {8}, {Placement::Shard(0)}, r);
    EXPECT_EQ(s.shape, (V{r < 2 ? 1 : 0})) << "rank " << r;
    EXPECT_EQ(s.offset, (V{r < 2 ? r : 2})) << "rank " << r;
    EXPECT_TRUE(ValidateRegion(s.region(), {2}).ok());
  }
}

TEST(DTensorTest, EmptyAfterNestingAlsoGetsTheGlobalSize) {
  // (4,) over a (2, 4) mesh: the first level gives [0,2) and [2,4); the second splits each
  // into four chunks of 1, the last two empty.
  LocalShard s = Local({4}, {2, 4}, {Placement::Shard(0), Placement::Shard(0)}, 6);
  EXPECT_EQ(s.shape, V{0});
  EXPECT_EQ(s.offset, V{4});
  s = Local({4}, {2, 4}, {Placement::Shard(0), Placement::Shard(0)}, 5);
  EXPECT_EQ(s.shape, V{1});
  EXPECT_EQ(s.offset, V{3});
}

TEST(DTensorTest, ReplicaIdIsTheCoordinateAlongReplicatedDims) {
  // TP x DP mesh (2, 3): Shard(1) along TP, Replicate along DP.
  for (int64_t r = 0; r < 6; ++r) {
    LocalShard s = Local({4, 6}, {2, 3}, {Placement::Shard(1), Placement::Replicate()}, r);
    EXPECT_EQ(s.replica_id, (V{r % 3}));
    EXPECT_EQ(s.is_main_replica(), r % 3 == 0);
    EXPECT_EQ(s.shape, (V{4, 3}));
    EXPECT_EQ(s.offset, (V{0, (r / 3) * 3}));
  }
}

TEST(DTensorTest, NegativeShardDimCountsFromTheEnd) {
  LocalShard s = Local({4, 6}, {2}, {Placement::Shard(-1)}, 1);
  EXPECT_EQ(s.shape, (V{4, 3}));
  EXPECT_EQ(s.offset, (V{0, 3}));
}

TEST(DTensorTest, InvalidPlacementsAreErrors) {
  DeviceMesh mesh = Mesh({2, 2});
  EXPECT_FALSE(ComputeLocalShard({4}, mesh, {Placement::Shard(0)}, 0).ok());  // count
  EXPECT_FALSE(ComputeLocalShard({4}, mesh, {Placement::Shard(1), Placement::Replicate()}, 0).ok());
  EXPECT_FALSE(
      ComputeLocalShard({4}, mesh, {Placement::Shard(-2), Placement::Replicate()}, 0).ok());
  EXPECT_FALSE(ComputeLocalShard({4}, mesh, {Placement::Shard(0), Placement::Replicate()}, 4).ok());
  auto st = ComputeLocalShard({-4}, mesh, {Placement::Replicate(), Placement::Replicate()}, 0);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(PlacementsString({Placement::Shard(0), Placement::Replicate()}),
            "[Shard(0), Replicate()]");
}

// ForEachLocalShard walks coordinates with an odometer and reuses one shard: each visit
// must see what Coordinate and ComputeLocalShard give that rank.
TEST(DTensorTest, ForEachLocalShardVisitsEveryRankAsComputeLocalShardDoes) {
  const DeviceMesh mesh = Mesh({2, 3, 2});
  const std::vector<Placement> placements = {Placement::Shard(1), Placement::Replicate(),
                                             Placement::Shard(1)};
  int64_t next = 0;
  absl::Status s = ForEachLocalShard(
      {5, 7}, mesh, placements,
      [&](int64_t rank, absl::Span<const int64_t> coord, const LocalShard& shard) {
        EXPECT_EQ(rank, next++);
        EXPECT_EQ(V(coord.begin(), coord.end()), *mesh.Coordinate(rank));
        LocalShard expected = *ComputeLocalShard({5, 7}, mesh, placements, rank);
        EXPECT_EQ(shard.shape, expected.shape) << rank;
        EXPECT_EQ(shard.offset, expected.offset) << rank;
        EXPECT_EQ(shard.replica_id, expected.replica_id) << rank;
        return rank == 9 ? absl::CancelledError("stop") : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(next, 10);
  EXPECT_FALSE(ForEachLocalShard({5}, mesh, placements,
                                 [](int64_t, absl::Span<const int64_t>, const LocalShard&) {
                                   return absl::OkStatus();
                                 })
                   .ok());  // Shard(1) of a 1-d tensor
}

// Brute force: apply torch.chunk to explicit index lists, mesh dim by mesh dim.
TEST(DTensorTest, AgreesWithBruteForceChunkingOfIndexLists) {
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    V shape = testing::RandomShape(rng, 3, 9);
    V mesh_shape(Uniform(rng, 0, 3));
    for (int64_t& m : mesh_shape) m = Uniform(rng, 1, 4);
    std::vector<Placement> placements;
    for (size_t i = 0; i < mesh_shape.size(); ++i) {
      if (shape.empty() || Uniform(rng, 0, 2) == 0) {
        placements.push_back(Placement::Replicate());
      } else {
        placements.push_back(Placement::Shard(Uniform(rng, 0, shape.size() - 1)));
      }
    }
    DeviceMesh mesh = Mesh(mesh_shape);
    SCOPED_TRACE(ShapeString(shape) + " " + mesh.DebugString() + " " +
                 PlacementsString(placements));
    auto all = ComputeAllLocalShards(shape, mesh, placements);
    ASSERT_TRUE(all.ok()) << all.status();
    std::map<V, int> main_cover;  // global multi-index -> number of main replicas holding it
    std::map<V, V> region_of_shard_coords;
    for (int64_t r = 0; r < mesh.size(); ++r) {
      V coord = *mesh.Coordinate(r);
      std::vector<V> lists(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        for (int64_t i = 0; i < shape[d]; ++i) lists[d].push_back(i);
      }
      V replica;
      for (size_t m = 0; m < mesh_shape.size(); ++m) {
        if (!placements[m].is_shard()) {
          replica.push_back(coord[m]);
          continue;
        }
        V& list = lists[placements[m].dim];
        const int64_t chunk = (list.size() + mesh_shape[m] - 1) / mesh_shape[m];
        V part;
        for (int64_t i = coord[m] * chunk; i < (coord[m] + 1) * chunk && i < (int64_t)list.size();
             ++i) {
          part.push_back(list[i]);
        }
        list = part;
      }
      const LocalShard& s = (*all)[r];
      ASSERT_EQ(s.replica_id, replica) << "rank " << r;
      for (size_t d = 0; d < shape.size(); ++d) {
        ASSERT_EQ(s.shape[d], (int64_t)lists[d].size()) << "rank " << r << " dim " << d;
        ASSERT_EQ(s.offset[d], lists[d].empty() ? shape[d] : lists[d][0])
            << "rank " << r << " dim " << d;
        // Chunks of contiguous lists stay contiguous.
        for (size_t i = 1; i < lists[d].size(); ++i) ASSERT_EQ(lists[d][i], lists[d][i - 1] + 1);
      }
      ASSERT_TRUE(ValidateRegion(s.region(), shape).ok());
      if (s.is_main_replica()) {
        for (int64_t g = 0; g < s.region().BoxElements(); ++g) {
          V idx(shape.size());
          int64_t rem = g;
          for (int d = (int)shape.size() - 1; d >= 0; --d) {
            idx[d] = s.offset[d] + rem % s.shape[d];
            rem /= s.shape[d];
          }
          ++main_cover[idx];
        }
      }
    }
    // Main replicas cover every element exactly once.
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    ASSERT_EQ((int64_t)main_cover.size(), total);
    for (const auto& [idx, n] : main_cover) ASSERT_EQ(n, 1);
  }
}

}  // namespace
}  // namespace ckpt
