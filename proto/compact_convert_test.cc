#include "proto/compact_convert.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/dtensor.h"

namespace ckpt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

pb::Placement Shard(int dim) {
  pb::Placement p;
  p.set_shard_dim(dim);
  return p;
}
pb::Placement Replicate() {
  pb::Placement p;
  p.set_replicate(true);
  return p;
}

// A DTensor's piece and layout as the C++ client describes them (ResolveLayout's rule:
// ComputeLocalShard, then the mesh's replica id followed by `suffix`).
struct Described {
  pb::PieceMeta piece;
  pb::TensorLayout layout;
};
Described DescribeDTensor(const std::string& key, std::vector<int64_t> shape,
                          const std::vector<int64_t>& mesh_shape, int64_t mesh_rank,
                          const std::vector<pb::Placement>& placements, int64_t suffix) {
  std::vector<Placement> ps;
  for (const pb::Placement& p : placements) {
    ps.push_back(p.has_replicate() ? Placement::Replicate() : Placement::Shard(p.shard_dim()));
  }
  DeviceMesh mesh = *DeviceMesh::Create(mesh_shape);
  LocalShard local = *ComputeLocalShard(shape, mesh, ps, mesh_rank);
  Described d;
  *d.piece.mutable_tensor() = TensorMetaToProto(TensorMeta{key, DType::kBF16, shape});
  *d.piece.mutable_region() = RegionToProto(local.region());
  d.piece.mutable_replica_id()->Add(local.replica_id.begin(), local.replica_id.end());
  d.piece.add_replica_id(suffix);
  d.layout.set_key(key);
  for (const pb::Placement& p : placements) *d.layout.add_placements() = p;
  return d;
}

// Rank 5 of a (2, 4) mesh, coordinate (1, 1): a mix of compact and listed pieces.
struct Mix {
  pb::RankState compact;
  pb::RankState full;
};
Mix MixedRank() {
  Mix mix;
  mix.compact.set_rank(5);
  mix.full.set_rank(5);
  RankStateWriter compact(&mix.compact, true), full(&mix.full, true);
  const std::vector<int64_t> mesh = {2, 4}, coordinate = {1, 1};
  Described a = DescribeDTensor("a", {13, 7}, mesh, 5, {Replicate(), Shard(0)}, 0);
  Described b = DescribeDTensor("b", {3}, mesh, 5, {Shard(0), Shard(0)}, 2);  // empty piece
  pb::PieceMeta plain;
  *plain.mutable_tensor() = TensorMetaToProto(TensorMeta{"plain", DType::kF32, {4}});
  *plain.mutable_region() = RegionToProto(WholeRegion({4}));
  plain.add_replica_id(1);
  pb::TensorLayout plain_layout;
  plain_layout.set_key("plain");
  pb::PieceMeta flat = plain;
  flat.mutable_tensor()->set_key("flat");
  flat.mutable_tensor()->set_global_shape(0, 10);
  *flat.mutable_region() = RegionToProto(Region{{0}, {10}, FlatRange{6, 9}});
  pb::TensorLayout flat_layout;
  flat_layout.set_key("flat");
  flat_layout.set_flat_sharded(true);
  EXPECT_TRUE(compact.AddDTensor(a.piece, pb::MEMORY_DEVICE, a.layout, mesh, coordinate));
  compact.AddPiece(plain, pb::MEMORY_HOST, plain_layout);
  EXPECT_TRUE(compact.AddDTensor(b.piece, pb::MEMORY_HOST, b.layout, mesh, coordinate));
  EXPECT_TRUE(compact.AddFlat(flat, pb::MEMORY_HOST, flat_layout, 4, 2));
  // The wrong coordinate does not reproduce the piece: it is listed instead.
  EXPECT_FALSE(compact.AddDTensor(a.piece, pb::MEMORY_HOST, a.layout, mesh, {0, 2}));
  full.AddPiece(a.piece, pb::MEMORY_DEVICE, a.layout);
  full.AddPiece(plain, pb::MEMORY_HOST, plain_layout);
  full.AddPiece(b.piece, pb::MEMORY_HOST, b.layout);
  full.AddPiece(flat, pb::MEMORY_HOST, flat_layout);
  full.AddPiece(a.piece, pb::MEMORY_HOST, a.layout);
  return mix;
}

TEST(CompactConvertTest, ExpansionGivesBackExactlyTheListedDescription) {
  Mix mix = MixedRank();
  EXPECT_EQ(mix.compact.compact_tensors_size(), 3);
  EXPECT_EQ(mix.compact.compact_meshes_size(), 1);  // shared by both DTensors
  EXPECT_EQ(mix.compact.shards_size(), 2);
  pb::RankState expanded;
  absl::StatusOr<const pb::RankState*> got =
      ExpandCompactTensors(mix.compact, &expanded, "job j rank 5");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, &expanded);
  EXPECT_EQ(expanded.SerializeAsString(), mix.full.SerializeAsString())
      << expanded.DebugString() << "\nvs\n"
      << mix.full.DebugString();
}

TEST(CompactConvertTest, ConsecutiveTensorsLaidOutAlikeShareOneRun) {
  pb::RankState compact, full;
  compact.set_rank(5);
  full.set_rank(5);
  RankStateWriter writer(&compact, true), listed(&full, true);
  const std::vector<int64_t> mesh = {2, 4}, coordinate = {1, 1};
  for (const char* key : {"x", "y", "z"}) {
    Described d = DescribeDTensor(key, {13, 7}, mesh, 5, {Replicate(), Shard(1)}, 0);
    EXPECT_TRUE(writer.AddDTensor(d.piece, pb::MEMORY_HOST, d.layout, mesh, coordinate));
    listed.AddPiece(d.piece, pb::MEMORY_HOST, d.layout);
  }
  Described other = DescribeDTensor("other", {13, 7}, mesh, 5, {Replicate(), Shard(0)}, 0);
  EXPECT_TRUE(writer.AddDTensor(other.piece, pb::MEMORY_HOST, other.layout, mesh, coordinate));
  listed.AddPiece(other.piece, pb::MEMORY_HOST, other.layout);
  ASSERT_EQ(compact.compact_tensors_size(), 2);
  EXPECT_EQ(compact.compact_tensors(0).tensors_size(), 3);
  EXPECT_EQ(compact.compact_tensors(1).index(0), 3);
  pb::RankState expanded;
  absl::StatusOr<const pb::RankState*> got = ExpandCompactTensors(compact, &expanded, "r");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(expanded.SerializeAsString(), full.SerializeAsString());
  EXPECT_LT(compact.ByteSizeLong() * 10, full.ByteSizeLong() * 7);
}

TEST(CompactConvertTest, AStateWithoutCompactTensorsIsUsedAsIs) {
  Mix mix = MixedRank();
  pb::RankState untouched;
  absl::StatusOr<const pb::RankState*> got = ExpandCompactTensors(mix.full, &untouched, "r");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, &mix.full);
  EXPECT_EQ(untouched.shards_size(), 0);
}

TEST(CompactConvertTest, CompactIsSmallerOnTheWire) {
  Mix mix = MixedRank();
  EXPECT_LT(mix.compact.ByteSizeLong(), mix.full.ByteSizeLong());
}

void ExpectRefused(const pb::RankState& state, const std::string& what) {
  pb::RankState expanded;
  absl::StatusOr<const pb::RankState*> got = ExpandCompactTensors(state, &expanded, "job j rank 5");
  ASSERT_FALSE(got.ok()) << what;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << what;
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr("job j rank 5"), HasSubstr("tensor ")))
      << what << ": " << got.status();
}

TEST(CompactConvertTest, HostileCompactTensorsAreRefusedNamingRankAndTensor) {
  const Mix mix = MixedRank();
  pb::RankState s = mix.compact;
  s.mutable_compact_tensors(1)->set_index(0, s.compact_tensors(0).index(0));
  ExpectRefused(s, "index taken twice");
  s = mix.compact;
  s.mutable_compact_tensors(0)->set_index(0, 5);
  ExpectRefused(s, "index past the pieces");
  s.mutable_compact_tensors(0)->set_index(0, -1);
  ExpectRefused(s, "negative index");
  s = mix.compact;
  s.mutable_compact_tensors(0)->add_index(4);
  ExpectRefused(s, "more indices than tensors");
  s = mix.compact;
  s.mutable_compact_tensors(0)->mutable_dtensor()->set_mesh(1);
  ExpectRefused(s, "unknown mesh");
  s = mix.compact;
  s.mutable_compact_tensors(0)->mutable_dtensor()->mutable_placements(0)->clear_kind();
  ExpectRefused(s, "placement without a kind");
  s = mix.compact;
  s.mutable_compact_tensors(0)->clear_dtensor();
  ExpectRefused(s, "no layout");
  s = mix.compact;
  s.mutable_compact_meshes(0)->set_coordinate(0, 2);
  ExpectRefused(s, "coordinate outside the mesh");
  s = mix.compact;
  s.mutable_compact_tensors(0)->mutable_tensors(0)->set_global_shape(0, -13);
  ExpectRefused(s, "negative size");
  s = mix.compact;
  s.mutable_compact_tensors(2)->mutable_flat()->set_part(4);
  ExpectRefused(s, "flat part outside the parts");
}

TEST(CompactConvertTest, MorePiecesThanTheBoundAreRefusedBeforeExpanding) {
  const Mix mix = MixedRank();  // 5 pieces
  pb::RankState expanded;
  absl::StatusOr<const pb::RankState*> got =
      ExpandCompactTensors(mix.compact, &expanded, "job j rank 5", /*max_pieces=*/4);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("job j rank 5 describes 5 pieces; at most 4"));
  EXPECT_TRUE(ExpandCompactTensors(mix.compact, &expanded, "job j rank 5", 5).ok());
}

// Random byte flips of a valid compact description: whatever still parses expands or is
// InvalidArgument, never a crash or another code (run under ASan in CI: tag "asan").
TEST(CompactConvertTest, CorruptedDescriptionsExpandOrAreRefusedNeverCrash) {
  const std::string valid = MixedRank().compact.SerializeAsString();
  std::mt19937 rng(80);
  int parsed = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = valid;
    for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    pb::RankState state;
    if (!state.ParseFromString(bytes)) continue;
    ++parsed;
    pb::RankState expanded;
    absl::StatusOr<const pb::RankState*> got = ExpandCompactTensors(state, &expanded, "r");
    if (!got.ok()) {
      ++refused;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_GT(refused, 10);
}

}  // namespace
}  // namespace ckpt
