#include "sharding/piece_id.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

PieceId Id(std::string key, std::vector<int64_t> offsets,
           std::optional<FlatRange> flat = std::nullopt) {
  return PieceId{std::move(key), std::move(offsets), flat};
}

int Cmp(const PieceId& a, const PieceId& b) { return ComparePieceIds(a, b); }

TEST(PieceIdTest, KeysCompareFirst) {
  EXPECT_LT(Cmp(Id("a", {9}), Id("b", {0})), 0);
  EXPECT_GT(Cmp(Id("b", {0}), Id("a", {9})), 0);
  EXPECT_LT(Cmp(Id("a", {}), Id("ab", {})), 0);  // prefix first
}

TEST(PieceIdTest, UnicodeKeysCompareAsCodePoints) {
  // Python: 'z' < 'é' (U+00E9) < '中' (U+4E2D) < '😀' (U+1F600); UTF-8 bytes order the same.
  std::vector<std::string> keys = {"\xF0\x9F\x98\x80", "\xE4\xB8\xAD", "\xC3\xA9", "z"};
  std::vector<PieceId> ids;
  for (const auto& k : keys) ids.push_back(Id(k, {0}));
  std::sort(ids.begin(), ids.end(), PieceIdLess());
  EXPECT_EQ(ids[0].key, "z");
  EXPECT_EQ(ids[1].key, "\xC3\xA9");
  EXPECT_EQ(ids[2].key, "\xE4\xB8\xAD");
  EXPECT_EQ(ids[3].key, "\xF0\x9F\x98\x80");
}

TEST(PieceIdTest, OffsetsCompareLexicographicallyWithPrefixFirst) {
  EXPECT_LT(Cmp(Id("w", {0, 5}), Id("w", {1, 0})), 0);
  EXPECT_LT(Cmp(Id("w", {1, 0}), Id("w", {1, 2})), 0);
  EXPECT_LT(Cmp(Id("w", {1}), Id("w", {1, 0})), 0);
  EXPECT_LT(Cmp(Id("w", {}), Id("w", {0})), 0);
  EXPECT_GT(Cmp(Id("w", {2}), Id("w", {1, 9})), 0);
  EXPECT_LT(Cmp(Id("w", {-1}), Id("w", {0})), 0);
}

TEST(PieceIdTest, FlatRangesCompareAsPairs) {
  EXPECT_LT(Cmp(Id("w", {0}, FlatRange{0, 4}), Id("w", {0}, FlatRange{0, 5})), 0);
  EXPECT_LT(Cmp(Id("w", {0}, FlatRange{0, 9}), Id("w", {0}, FlatRange{1, 2})), 0);
  EXPECT_EQ(Cmp(Id("w", {0}, FlatRange{1, 2}), Id("w", {0}, FlatRange{1, 2})), 0);
  EXPECT_EQ(Cmp(Id("w", {0}), Id("w", {0})), 0);
}

TEST(PieceIdTest, NoneVersusRangeIsIncomparable) {
  bool incomparable = false;
  int c = ComparePieceIds(Id("w", {0}), Id("w", {0}, FlatRange{0, 1}), &incomparable);
  EXPECT_TRUE(incomparable);
  EXPECT_LT(c, 0);  // None first, as PieceIdLess orders them
  c = ComparePieceIds(Id("w", {0}, FlatRange{0, 1}), Id("w", {0}), &incomparable);
  EXPECT_TRUE(incomparable);
  EXPECT_GT(c, 0);
  // PieceIdLess still orders them (None first) so containers work.
  EXPECT_TRUE(PieceIdLess()(Id("w", {0}), Id("w", {0}, FlatRange{0, 1})));
  EXPECT_FALSE(PieceIdLess()(Id("w", {0}, FlatRange{0, 1}), Id("w", {0})));
  // Earlier differences decide before the flat ranges are looked at.
  incomparable = true;
  c = ComparePieceIds(Id("a", {0}), Id("b", {0}, FlatRange{0, 1}), &incomparable);
  EXPECT_FALSE(incomparable);
  EXPECT_LT(c, 0);
}

TEST(PieceIdTest, DebugStringLooksLikePython) {
  EXPECT_EQ(Id("w", {0, 128}, FlatRange{0, 4096}).DebugString(), "('w', (0, 128), (0, 4096))");
  EXPECT_EQ(Id("w", {3}).DebugString(), "('w', (3,), None)");
}

TEST(PieceIdTest, HashDistinguishesFlatRanges) {
  absl::flat_hash_set<PieceId> set = {Id("w", {0}), Id("w", {0}, FlatRange{0, 1}),
                                      Id("w", {0}, FlatRange{0, 2})};
  EXPECT_EQ(set.size(), 3u);
  EXPECT_TRUE(set.contains(Id("w", {0}, FlatRange{0, 1})));
}

}  // namespace
}  // namespace ckpt
