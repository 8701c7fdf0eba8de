#include "coordinator/description_cache.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/rank_description.h"
#include "proto/state_digest.h"

namespace ckpt::coordinator {
namespace {

pb::RankState State(int rank, int pieces) {
  pb::RankState state;
  state.set_rank(rank);
  for (int i = 0; i < pieces; ++i) {
    pb::PieceMeta* piece = state.add_shards();
    piece->mutable_tensor()->set_key("decoder.layers." + std::to_string(i) +
                                     ".self_attention.linear_qkv.weight");
    piece->mutable_tensor()->add_global_shape(64);
    piece->mutable_region()->add_offsets(rank * 8);
    piece->mutable_region()->add_lengths(8);
  }
  return state;
}

// The bytes a cache counts for keeping `state` alone.
int64_t KeptBytes(const pb::RankState& state) {
  DescriptionCache cache;
  cache.Keep("j", 1, 0, state);
  return cache.Stats().bytes;
}

// Rank `rank` of a data-parallel job: the same tensors on every rank, its own replica ids and
// flat ranges, plus layouts and memory kinds.
pb::RankState ReplicaState(int rank, int pieces) {
  pb::RankState state = State(0, pieces);
  state.set_rank(rank);
  for (int i = 0; i < pieces; ++i) {
    pb::PieceMeta* piece = state.mutable_shards(i);
    piece->add_replica_id(0);
    piece->add_replica_id(rank);
    if (i % 2 == 1) {
      piece->mutable_region()->mutable_flat()->set_start(rank);
      piece->mutable_region()->mutable_flat()->set_stop(rank + 1);
    }
    state.add_memory_kinds(pb::MEMORY_HOST);
  }
  state.add_layouts()->set_key("decoder.layers.0.self_attention.linear_qkv.weight");
  state.add_mesh_shape(4);
  return state;
}

TEST(DescriptionCacheTest, RanksWithTheSamePiecesShareOneKeptListAndGetTheirOwnBack) {
  DescriptionCache cache;
  std::vector<std::string> digests;
  int64_t described = 0;
  for (int r = 0; r < 8; ++r) {
    digests.push_back(cache.Keep("j", 8, r, ReplicaState(r, 50)));
    described += static_cast<int64_t>(ReplicaState(r, 50).ByteSizeLong());
  }
  for (int r = 0; r < 8; ++r) {
    auto kept = cache.Lookup("j", 8, r, digests[r]);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ((*kept)->SerializeAsString(), ReplicaState(r, 50).SerializeAsString()) << r;
    EXPECT_EQ(DescriptionDigest(**kept), digests[r]);
  }
  EXPECT_LT(cache.Stats().bytes, described / 3);  // each rank's own part, not 8 lists
  // Asked for layout classes, the cache hands out the kept ones and no rebuilt pieces.
  std::shared_ptr<const RankPieces> pieces;
  auto rest = cache.Lookup("j", 8, 5, digests[5], &pieces);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_NE(pieces, nullptr);
  EXPECT_EQ((*rest)->shards_size(), 0);
  EXPECT_EQ((*rest)->memory_kinds_size(), 50);
  std::shared_ptr<const RankPieces> other;
  ASSERT_TRUE(cache.Lookup("j", 8, 2, digests[2], &other).ok());
  EXPECT_EQ(pieces->list(), other->list());
  pb::RankState whole = **rest;
  for (const pb::PieceMeta& piece : pieces->Pieces()) *whole.add_shards() = piece;
  EXPECT_EQ(DescriptionDigest(whole), digests[5]);
  std::shared_ptr<const RankPieces> split;
  cache.Keep("j", 8, 6, ReplicaState(6, 50), nullptr, &split);
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->list(), pieces->list());
  EXPECT_EQ(split->Piece(3).SerializeAsString(), ReplicaState(6, 50).shards(3).SerializeAsString());
}

TEST(DescriptionCacheTest, KeepsTheDescriptionUnderItsOwnDigestAndReturnsItOnAMatch) {
  DescriptionCache cache;
  bool stored = false;
  const std::string digest = cache.Keep("j", 2, 1, State(1, 3), &stored);
  EXPECT_TRUE(stored);
  EXPECT_EQ(digest, DescriptionDigest(State(1, 3)));
  auto kept = cache.Lookup("j", 2, 1, digest);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->SerializeAsString(), State(1, 3).SerializeAsString());
  EXPECT_EQ(cache.Stats().hits, 1);
  EXPECT_EQ(cache.Stats().entries, 1);
}

TEST(DescriptionCacheTest, RefusesAnotherDigestAnUnknownRankJobOrWorldSize) {
  DescriptionCache cache;
  const std::string digest = cache.Keep("j", 2, 1, State(1, 3));
  const std::string other = DescriptionDigest(State(1, 4));
  auto refused = cache.Lookup("j", 2, 1, other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("job j rank 1"), std::string::npos);
  EXPECT_NE(refused.status().message().find("send the full description"), std::string::npos);
  EXPECT_FALSE(cache.Lookup("j", 2, 0, digest).ok());  // another rank
  EXPECT_FALSE(cache.Lookup("k", 2, 1, digest).ok());  // another job
  EXPECT_FALSE(cache.Lookup("j", 4, 1, digest).ok());  // another world size
  EXPECT_EQ(cache.Stats().misses, 4);
  EXPECT_EQ(cache.Stats().hits, 0);
}

TEST(DescriptionCacheTest, AKeepReplacesTheRanksEarlierDescription) {
  DescriptionCache cache;
  const std::string first = cache.Keep("j", 2, 0, State(0, 3));
  const std::string second = cache.Keep("j", 2, 0, State(0, 5));
  EXPECT_NE(first, second);
  EXPECT_FALSE(cache.Lookup("j", 2, 0, first).ok());
  EXPECT_TRUE(cache.Lookup("j", 2, 0, second).ok());
  EXPECT_EQ(cache.Stats().entries, 1);
  EXPECT_EQ(cache.Stats().bytes, KeptBytes(State(0, 5)));
}

TEST(DescriptionCacheTest, AJobAtAnotherWorldSizeReplacesTheOldEntries) {
  DescriptionCache cache;
  const std::string old = cache.Keep("j", 2, 0, State(0, 3));
  cache.Keep("j", 2, 1, State(1, 3));
  cache.Keep("j", 4, 0, State(0, 3));  // the job restarted with 4 ranks
  EXPECT_EQ(cache.Stats().entries, 1);
  EXPECT_FALSE(cache.Lookup("j", 2, 1, DescriptionDigest(State(1, 3))).ok());
  EXPECT_TRUE(cache.Lookup("j", 4, 0, old).ok());
}

TEST(DescriptionCacheTest, DropRankAndDropJobForgetAndFreeTheBytes) {
  DescriptionCache cache;
  const std::string d0 = cache.Keep("j", 2, 0, State(0, 3));
  const std::string d1 = cache.Keep("j", 2, 1, State(1, 3));
  cache.Keep("k", 1, 0, State(0, 2));
  cache.DropRank("j", 0);
  EXPECT_FALSE(cache.Lookup("j", 2, 0, d0).ok());
  EXPECT_TRUE(cache.Lookup("j", 2, 1, d1).ok());
  cache.DropJob("j");
  EXPECT_FALSE(cache.Lookup("j", 2, 1, d1).ok());
  EXPECT_EQ(cache.Stats().entries, 1);
  EXPECT_EQ(cache.Stats().bytes, KeptBytes(State(0, 2)));
  cache.DropRank("k", 0);
  EXPECT_EQ(cache.Stats().entries, 0);
  EXPECT_EQ(cache.Stats().bytes, 0);
}

TEST(DescriptionCacheTest, TheMemoryBoundEvictsTheLeastRecentlyUsedJob) {
  const int64_t one = KeptBytes(State(0, 4));
  DescriptionCache cache(/*max_bytes=*/2 * one);
  const std::string a = cache.Keep("a", 1, 0, State(0, 4));
  const std::string b = cache.Keep("b", 1, 0, State(0, 4));
  ASSERT_TRUE(cache.Lookup("a", 1, 0, a).ok());  // "a" is now the most recently used
  cache.Keep("c", 1, 0, State(0, 4));            // evicts "b"
  EXPECT_TRUE(cache.Lookup("a", 1, 0, a).ok());
  EXPECT_FALSE(cache.Lookup("b", 1, 0, b).ok());
  EXPECT_EQ(cache.Stats().evictions, 1);
  EXPECT_LE(cache.Stats().bytes, 2 * one);
  // A description larger than the bound is not kept (the rank keeps sending it in full).
  bool kept = true;
  const std::string huge = cache.Keep("d", 1, 0, State(0, 40), &kept);
  EXPECT_FALSE(kept);
  EXPECT_FALSE(cache.Lookup("d", 1, 0, huge).ok());
  EXPECT_LE(cache.Stats().bytes, 2 * one);
}

// A full description yields its layout class (the list the cache interned, the rest of the
// state but the rank) under SplitDescription's digest; a rank of the same class kept by
// reference is looked up like one kept in full.
TEST(DescriptionCacheTest, AFullDescriptionGivesItsClassAndAReferenceIsKeptLikeIt) {
  DescriptionCache cache;
  PieceClass layout_class;
  std::string class_digest;
  bool kept = false;
  std::shared_ptr<const RankPieces> pieces;
  const pb::RankState full = ReplicaState(0, 10);
  const std::string digest =
      cache.Keep("j", 4, 0, full, &kept, &pieces, nullptr, &layout_class, &class_digest);
  ASSERT_TRUE(kept);
  const absl::StatusOr<DescriptionSplit> split = SplitDescription(full);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(digest, split->digest);
  EXPECT_EQ(class_digest, split->class_digest);
  ASSERT_NE(layout_class.list, nullptr);
  EXPECT_EQ(layout_class.list.get(), pieces->list());  // the interned list itself
  pb::RankState rest;
  ASSERT_TRUE(rest.ParseFromString(*layout_class.rest));
  EXPECT_EQ(rest.rank(), 0);  // not part of the class
  EXPECT_EQ(rest.shards_size(), 0);
  EXPECT_EQ(rest.mesh_shape_size(), 1);

  const pb::RankState other = ReplicaState(3, 10);
  const absl::StatusOr<DescriptionSplit> other_split = SplitDescription(other);
  ASSERT_EQ(other_split->class_digest, class_digest);
  absl::StatusOr<RankPieces> rebuilt = PiecesOfColumn(layout_class.list, other_split->column);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  rest.set_rank(3);
  ASSERT_TRUE(cache.KeepReferenced("j", 4, 3, other_split->digest,
                                   std::make_shared<const RankPieces>(*rebuilt),
                                   rest.SerializeAsString()));
  std::shared_ptr<const RankPieces> found_pieces;
  absl::StatusOr<std::shared_ptr<const pb::RankState>> found =
      cache.Lookup("j", 4, 3, DescriptionDigest(other), &found_pieces);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->rank(), 3);
  ASSERT_EQ(found_pieces->size(), 10);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(found_pieces->Piece(i).SerializeAsString(), other.shards(i).SerializeAsString());
  }
}

}  // namespace
}  // namespace ckpt::coordinator
