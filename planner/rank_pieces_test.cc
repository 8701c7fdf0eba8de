#include "planner/rank_pieces.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

pb::PieceMeta Meta(const std::string& key, std::vector<int64_t> offsets,
                   std::vector<int64_t> lengths, std::vector<int64_t> replica,
                   std::optional<std::pair<int64_t, int64_t>> flat = std::nullopt) {
  pb::PieceMeta m;
  m.mutable_tensor()->set_key(key);
  m.mutable_tensor()->set_dtype(pb::DTYPE_F32);
  for (int64_t d : lengths) m.mutable_tensor()->add_global_shape(d * 4);
  for (int64_t o : offsets) m.mutable_region()->add_offsets(o);
  for (int64_t l : lengths) m.mutable_region()->add_lengths(l);
  if (flat) {
    m.mutable_region()->mutable_flat()->set_start(flat->first);
    m.mutable_region()->mutable_flat()->set_stop(flat->second);
  }
  for (int64_t c : replica) m.add_replica_id(c);
  return m;
}

TEST(RankPiecesTest, EveryPieceReadsBackAsDescribed) {
  std::vector<pb::PieceMeta> metas = {
      Meta("a", {0, 4}, {4, 4}, {0, 1}), Meta("b", {0}, {8}, {}, std::make_pair(0, 0)),
      Meta("c", {4}, {4}, {2}, std::make_pair(1, 3)), Meta("d", {0}, {4}, {0, 1})};
  RankPieces pieces(metas);
  ASSERT_EQ(pieces.size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pieces.Piece(i).SerializeAsString(), metas[i].SerializeAsString()) << i;
    EXPECT_EQ(pieces.shared(i).replica_id_size(), 0);
  }
  EXPECT_FALSE(pieces.is_main_replica(0));
  EXPECT_TRUE(pieces.is_main_replica(1));
  EXPECT_TRUE(pieces.has_flat(1));  // an empty flat range is still a flat range
  EXPECT_EQ(pieces.flat_start(2), 1);
  EXPECT_EQ(pieces.flat_stop(2), 3);
  EXPECT_FALSE(pieces.has_flat(3));
}

TEST(RankPiecesTest, RanksDifferingInReplicaIdsAndFlatRangesShareOneList) {
  PieceListInterner interner;
  std::vector<RankPieces> ranks;
  for (int dp = 0; dp < 4; ++dp) {
    RankPieces pieces(
        {Meta("w", {0}, {8}, {dp}), Meta("opt", {0}, {8}, {}, std::make_pair(2 * dp, 2 * dp + 2))});
    interner.Intern(&pieces);
    ranks.push_back(std::move(pieces));
  }
  RankPieces other({Meta("w", {8}, {8}, {0})});
  interner.Intern(&other);
  for (int dp = 1; dp < 4; ++dp) EXPECT_EQ(ranks[dp].list(), ranks[0].list());
  EXPECT_NE(other.list(), ranks[0].list());
  EXPECT_EQ(ranks[3].Piece(0).replica_id(0), 3);
  EXPECT_EQ(ranks[3].Piece(1).region().flat().start(), 6);
  EXPECT_EQ(interner.LiveLists(), 2);
  ranks.clear();
  EXPECT_EQ(interner.LiveLists(), 1);  // a list no rank holds is not kept alive
}

TEST(RankPiecesTest, DescribedRanksCopyNoPieceOnceTheirListIsInterned) {
  PieceListInterner interner;
  google::protobuf::RepeatedPtrField<pb::PieceMeta> first, second;
  for (auto* list : {&first, &second}) {
    const int64_t dp = list == &first ? 0 : 1;
    *list->Add() = Meta("w", {0}, {8}, {dp});
    *list->Add() = Meta("opt", {0}, {8}, {}, std::make_pair(4 * dp, 4 * dp + 4));
  }
  RankPieces a = RankPieces::Describe(first);
  EXPECT_EQ(a.described_size(), 2);
  EXPECT_EQ(a.list(), nullptr);  // no list until interned
  interner.Intern(&a, first);
  RankPieces b = RankPieces::Describe(second);
  interner.Intern(&b, second);
  RankPieces c(std::vector<pb::PieceMeta>(second.begin(), second.end()));  // split by copy
  interner.Intern(&c);
  EXPECT_EQ(b.list(), a.list());
  EXPECT_EQ(c.list(), a.list());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a.Piece(i).SerializeAsString(), first[i].SerializeAsString());
    EXPECT_EQ(b.Piece(i).SerializeAsString(), second[i].SerializeAsString());
  }
}

TEST(RankPiecesTest, AnInternedRankKeepsNoBufferOfItsInterningKey) {
  // The key (the serialized stripped list) is as large as the list: a rank that kept its buffer
  // after interning held ~30 KiB at the loadgen's GPT layout, 3 GiB at 100k ranks.
  google::protobuf::RepeatedPtrField<pb::PieceMeta> list;
  for (int i = 0; i < 200; ++i) *list.Add() = Meta(absl::StrCat("tensor.", i), {0}, {8}, {0});
  PieceListInterner interner;
  RankPieces first = RankPieces::Describe(list);
  RankPieces second = RankPieces::Describe(list);
  const int64_t described = second.OwnBytes();
  interner.Intern(&first, list);   // builds the list
  interner.Intern(&second, list);  // finds it
  EXPECT_EQ(second.list(), first.list());
  EXPECT_LT(second.OwnBytes(), described / 4) << described;
  EXPECT_LT(first.OwnBytes(), described / 4) << described;
}

TEST(RankPiecesTest, ListsDifferingInAnyFieldAreNotShared) {
  PieceListInterner interner;
  RankPieces a({Meta("w", {0}, {8}, {0})});
  RankPieces b({Meta("w", {0}, {8}, {0}, std::make_pair(0, 8))});  // a flat range
  RankPieces c({Meta("w", {0}, {7}, {0})});
  RankPieces d({Meta("w", {0}, {8}, {0}), Meta("w", {0}, {8}, {0})});
  for (RankPieces* p : {&a, &b, &c, &d}) interner.Intern(p);
  EXPECT_NE(a.list(), b.list());
  EXPECT_NE(a.list(), c.list());
  EXPECT_NE(a.list(), d.list());
  EXPECT_EQ(interner.LiveLists(), 4);
}

// The interning key is read from each piece in place (not its stripped wire form): every
// field a list holds still tells lists apart, through both ways of describing a rank, and
// offsets and lengths are not confused (the same numbers moved between them).
TEST(RankPiecesTest, DescribedListsDifferingInAnyFieldAreNotShared) {
  std::vector<pb::PieceMeta> variants = {
      Meta("w", {0, 4}, {8, 4}, {0}), Meta("v", {0, 4}, {8, 4}, {0}),
      Meta("w", {4, 0}, {8, 4}, {0}), Meta("w", {0, 4}, {8, 8}, {0}),
      Meta("w", {0, 4}, {8, 4}, {0}, std::make_pair(0, 8))};
  variants.push_back(variants[0]);
  variants.back().mutable_tensor()->set_dtype(pb::DTYPE_BF16);
  variants.push_back(variants[0]);
  variants.back().mutable_tensor()->add_global_shape(1);
  variants.push_back(variants[0]);
  variants.back().clear_region();
  variants.push_back(variants[0]);  // the same numbers, one moved from lengths to offsets
  variants.back().mutable_region()->add_offsets(8);  // offsets 0 4 8, lengths 4
  variants.back().mutable_region()->clear_lengths();
  variants.back().mutable_region()->add_lengths(4);
  PieceListInterner interner;
  std::vector<RankPieces> ranks;
  for (const pb::PieceMeta& v : variants) {
    google::protobuf::RepeatedPtrField<pb::PieceMeta> one;
    *one.Add() = v;
    ranks.push_back(RankPieces::Describe(one));
    interner.Intern(&ranks.back(), one);
  }
  EXPECT_EQ(interner.LiveLists(), static_cast<int>(variants.size()));
  // And a copy differing only in replica id and flat range values shares the list, whichever
  // way each was described.
  pb::PieceMeta replica = variants[4];
  replica.set_replica_id(0, 3);
  replica.mutable_region()->mutable_flat()->set_start(8);
  replica.mutable_region()->mutable_flat()->set_stop(16);
  RankPieces built({replica});
  interner.Intern(&built);
  EXPECT_EQ(built.list(), ranks[4].list());
}

}  // namespace
}  // namespace ckpt
