#include "planner/rank_description.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/state_digest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

pb::PieceMeta Piece(const std::string& key, int64_t row, std::vector<int64_t> replica,
                    std::optional<std::pair<int64_t, int64_t>> flat = std::nullopt) {
  pb::PieceMeta p;
  p.mutable_tensor()->set_key(key);
  p.mutable_tensor()->set_dtype(pb::DTYPE_F32);
  p.mutable_tensor()->add_global_shape(8);
  p.mutable_tensor()->add_global_shape(4);
  p.mutable_region()->add_offsets(row);
  p.mutable_region()->add_offsets(0);
  p.mutable_region()->add_lengths(2);
  p.mutable_region()->add_lengths(4);
  if (flat) {
    p.mutable_region()->mutable_flat()->set_start(flat->first);
    p.mutable_region()->mutable_flat()->set_stop(flat->second);
  }
  for (int64_t c : replica) p.add_replica_id(c);
  return p;
}

// Rank `rank` of TP 2 x DP 2: weights by rows over TP (replica id = dp), an optimizer state
// flat over DP of its TP box (main everywhere).
pb::RankState State(int rank) {
  const int tp = rank % 2, dp = rank / 2;
  pb::RankState s;
  s.set_rank(rank);
  *s.add_shards() = Piece("w", 2 * tp, {dp});
  *s.add_shards() = Piece("exp_avg", 2 * tp, {0}, std::make_pair(4 * dp, 4 * dp + 4));
  *s.add_shards() = Piece("b", 4 + 2 * tp, {dp, 1});
  s.add_mesh_shape(2);
  s.add_mesh_shape(2);
  return s;
}

// The coordinator's view of a reference: the class's interned list and the column.
std::shared_ptr<const SharedPieceList> ListOf(const pb::RankState& state) {
  RankPieces pieces(std::vector<pb::PieceMeta>(state.shards().begin(), state.shards().end()));
  return pieces.shared_list();
}

TEST(RankDescriptionTest, ReplicasShareTheClassAndDifferInTheirDigest) {
  const absl::StatusOr<DescriptionSplit> dp0 = SplitDescription(State(0));
  const absl::StatusOr<DescriptionSplit> dp1 = SplitDescription(State(2));
  const absl::StatusOr<DescriptionSplit> tp1 = SplitDescription(State(1));
  ASSERT_TRUE(dp0.ok() && dp1.ok() && tp1.ok());
  EXPECT_EQ(dp0->class_digest, dp1->class_digest);  // same pieces, other replica ids and ranges
  EXPECT_NE(dp0->class_digest, tp1->class_digest);  // other rows
  EXPECT_NE(dp0->digest, dp1->digest);
  EXPECT_EQ(dp0->class_digest.size(), 32u);
  // The rest of the description is part of the class, the rank is not.
  pb::RankState other_mesh = State(2);
  other_mesh.set_mesh_shape(0, 4);
  EXPECT_NE(SplitDescription(other_mesh)->class_digest, dp0->class_digest);
  pb::RankState renumbered = State(2);
  renumbered.set_rank(7);
  EXPECT_EQ(SplitDescription(renumbered)->class_digest, dp1->class_digest);
  EXPECT_NE(SplitDescription(renumbered)->digest, dp1->digest);
  // Any change of a piece's key, dtype, shape or box changes the class.
  for (int change = 0; change < 4; ++change) {
    pb::RankState s = State(2);
    pb::PieceMeta* p = s.mutable_shards(1);
    if (change == 0) p->mutable_tensor()->set_key("exp_avg_sq");
    if (change == 1) p->mutable_tensor()->set_dtype(pb::DTYPE_BF16);
    if (change == 2) p->mutable_tensor()->set_global_shape(0, 9);
    if (change == 3) p->mutable_region()->set_lengths(0, 1);
    EXPECT_NE(SplitDescription(s)->class_digest, dp1->class_digest) << "change " << change;
  }
  // A replica id or flat range change stays in the class, changes the description.
  pb::RankState moved = State(2);
  moved.mutable_shards(1)->mutable_region()->mutable_flat()->set_stop(7);
  EXPECT_EQ(SplitDescription(moved)->class_digest, dp1->class_digest);
  EXPECT_NE(SplitDescription(moved)->digest, dp1->digest);
}

// What the coordinator rebuilds from a reference is the rank's description, piece for piece,
// and has the digest the worker computed from its full state.
TEST(RankDescriptionTest, AReferenceRebuildsTheDescriptionAndItsDigest) {
  for (int rank = 0; rank < 4; ++rank) {
    const pb::RankState state = State(rank);
    const absl::StatusOr<DescriptionSplit> split = SplitDescription(state);
    ASSERT_TRUE(split.ok()) << split.status();
    // The class list as held from another replica of the class (rank % 2).
    absl::StatusOr<RankPieces> rebuilt = PiecesOfColumn(ListOf(State(rank % 2)), split->column);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    ASSERT_EQ(rebuilt->size(), state.shards_size());
    for (int i = 0; i < state.shards_size(); ++i) {
      EXPECT_EQ(rebuilt->Piece(i).SerializeAsString(), state.shards(i).SerializeAsString())
          << "rank " << rank << " piece " << i;
    }
    EXPECT_EQ(SplitDescriptionDigest(split->class_digest, rank, ColumnOf(*rebuilt)), split->digest);
    EXPECT_EQ(DescriptionDigest(state), split->digest);
  }
}

TEST(RankDescriptionTest, CompactDescriptionsAreDigestedAsSentAndNotSplit) {
  pb::RankState state = State(0);
  pb::CompactTensors* run = state.add_compact_tensors();
  run->add_tensors()->set_key("c");
  EXPECT_EQ(DescriptionDigest(state), RankStateDigest(state));
  EXPECT_THAT(SplitDescription(state).status().message(), HasSubstr("compact"));
}

TEST(RankDescriptionTest, AColumnThatDoesNotFitItsClassIsRefusedNamingWhy) {
  const std::shared_ptr<const SharedPieceList> list = ListOf(State(0));
  const pb::RankColumn good = SplitDescription(State(2))->column;
  ASSERT_TRUE(PiecesOfColumn(list, good).ok());
  pb::RankColumn c = good;
  c.add_replica_of_piece(0);
  EXPECT_THAT(PiecesOfColumn(list, c).status().message(),
              HasSubstr("names 4 pieces; the layout class has 3"));
  c = good;
  c.set_replica_of_piece(1, 9);
  EXPECT_THAT(PiecesOfColumn(list, c).status().message(), HasSubstr("names replica id 9"));
  c = good;
  c.set_replica_of_piece(1, -1);
  EXPECT_EQ(PiecesOfColumn(list, c).status().code(), absl::StatusCode::kInvalidArgument);
  c = good;
  c.add_flat_ranges(1);
  EXPECT_THAT(PiecesOfColumn(list, c).status().message(), HasSubstr("odd"));
  c.add_flat_ranges(2);
  EXPECT_THAT(PiecesOfColumn(list, c).status().message(), HasSubstr("2 flat ranges"));
  for (int i = 0; i < 5; ++i) c.add_replica_ids();
  c.clear_flat_ranges();
  EXPECT_FALSE(PiecesOfColumn(list, c).ok());
  EXPECT_FALSE(PiecesOfColumn(nullptr, good).ok());
}

}  // namespace
}  // namespace ckpt
