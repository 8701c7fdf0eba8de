#include "proto/state_digest.h"

#include <string>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

pb::PieceMeta Piece(const std::string& key, int64_t offset) {
  pb::PieceMeta piece;
  piece.mutable_tensor()->set_key(key);
  piece.mutable_tensor()->set_dtype(pb::DTYPE_F32);
  piece.mutable_tensor()->add_global_shape(8);
  piece.mutable_region()->add_offsets(offset);
  piece.mutable_region()->add_lengths(4);
  return piece;
}

pb::RankState State() {
  pb::RankState state;
  state.set_rank(3);
  *state.add_shards() = Piece("w", 0);
  *state.add_shards() = Piece("b", 4);
  state.add_memory_kinds(pb::MEMORY_HOST);
  state.add_memory_kinds(pb::MEMORY_HOST);
  state.add_mesh_shape(2);
  return state;
}

TEST(RankStateDigestTest, IsA32ByteSha256AndStableAcrossBuilds) {
  const std::string digest = RankStateDigest(State());
  EXPECT_EQ(digest.size(), 32u);
  EXPECT_EQ(digest, RankStateDigest(State()));
  // Equals SHA-256 of the serialization (no map fields, so deterministic = ordinary).
  EXPECT_EQ(digest, RankStateDigestOfBytes(State().SerializeAsString()));
  EXPECT_EQ(ShortDigest(digest).size(), 16u);
}

TEST(RankStateDigestTest, FieldsSetOrArrivingInAnyOrderGiveTheSameDigest) {
  pb::RankState reversed;  // the same description with its fields set in the opposite order
  reversed.add_mesh_shape(2);
  reversed.add_memory_kinds(pb::MEMORY_HOST);
  reversed.add_memory_kinds(pb::MEMORY_HOST);
  *reversed.add_shards() = Piece("w", 0);
  *reversed.add_shards() = Piece("b", 4);
  reversed.set_rank(3);
  EXPECT_EQ(RankStateDigest(reversed), RankStateDigest(State()));

  // On the wire the fields may come in any order (field 4 before field 2): parsed, the
  // description is the same and so is its digest (canonical re-serialization).
  pb::RankState mesh_only, rest = State();
  mesh_only.add_mesh_shape(2);
  rest.clear_mesh_shape();
  pb::RankState parsed;
  ASSERT_TRUE(parsed.ParseFromString(mesh_only.SerializeAsString() + rest.SerializeAsString()));
  EXPECT_EQ(RankStateDigest(parsed), RankStateDigest(State()));
}

TEST(RankStateDigestTest, AnyChangeOfTheDescriptionChangesTheDigest) {
  const std::string digest = RankStateDigest(State());
  pb::RankState other = State();
  other.mutable_shards(1)->mutable_region()->set_offsets(0, 5);
  EXPECT_NE(RankStateDigest(other), digest);
  other = State();
  other.set_rank(4);
  EXPECT_NE(RankStateDigest(other), digest);
  other = State();
  other.mutable_shards()->SwapElements(0, 1);  // piece order is part of the description
  EXPECT_NE(RankStateDigest(other), digest);
  other = State();
  other.set_memory_kinds(0, pb::MEMORY_DEVICE);
  EXPECT_NE(RankStateDigest(other), digest);
  EXPECT_NE(RankStateDigest(pb::RankState()), digest);
}

}  // namespace
}  // namespace ckpt
