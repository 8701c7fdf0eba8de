#include "sharding/box_index.h"

#include <random>
#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "sharding/overlap.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using Pairs = std::set<std::pair<int64_t, int64_t>>;

Pairs Collect(absl::Span<const Region> a, absl::Span<const Region> b) {
  Pairs got;
  ForEachIntersectingPair(a, b, [&](int64_t i, int64_t j) {
    EXPECT_TRUE(got.insert({i, j}).second) << "pair reported twice: " << i << ", " << j;
    return true;
  });
  return got;
}

Pairs BruteForce(absl::Span<const Region> a, absl::Span<const Region> b, bool self) {
  Pairs want;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = self ? i + 1 : 0; j < b.size(); ++j) {
      if (IntersectBoxes(a[i], b[j]).has_value()) want.insert({i, j});
    }
  }
  return want;
}

TEST(BoxIndexTest, AgreesWithAllPairsOnRandomBoxes) {
  std::mt19937_64 rng(99);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<int64_t> shape = testing::RandomShape(rng, 4, 12);
    std::vector<Region> a(testing::Uniform(rng, 0, 25)), b(testing::Uniform(rng, 0, 25));
    for (Region& r : a) r = testing::RandomBox(rng, shape);
    for (Region& r : b) r = testing::RandomBox(rng, shape);
    ASSERT_EQ(Collect(a, b), BruteForce(a, b, false)) << ShapeString(shape);
    Pairs self;
    ForEachSelfIntersectingPair(a, [&](int64_t i, int64_t j) {
      EXPECT_LT(i, j);
      EXPECT_TRUE(self.insert({i, j}).second);
      return true;
    });
    ASSERT_EQ(self, BruteForce(a, a, true)) << ShapeString(shape);
  }
}

TEST(BoxIndexTest, TouchingTilesDoNotIntersect) {
  // A 4x4 grid of 2x2 tiles against itself shifted: each tile meets exactly itself.
  std::vector<Region> tiles;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) tiles.push_back(Region{{2 * i, 2 * j}, {2, 2}, std::nullopt});
  }
  Pairs got = Collect(tiles, tiles);
  EXPECT_EQ(got.size(), tiles.size());
  for (const auto& [i, j] : got) EXPECT_EQ(i, j);
  int self_pairs = 0;
  ForEachSelfIntersectingPair(tiles, [&](int64_t, int64_t) { return ++self_pairs, true; });
  EXPECT_EQ(self_pairs, 0);
}

TEST(BoxIndexTest, StopsWhenAskedTo) {
  std::vector<Region> boxes(10, Region{{0, 0}, {4, 4}, std::nullopt});
  int calls = 0;
  ForEachSelfIntersectingPair(boxes, [&](int64_t, int64_t) { return ++calls < 3; });
  EXPECT_EQ(calls, 3);
}

TEST(BoxIndexTest, ThreeDimGridsSplitAlongAnyTwoDims) {
  // Expert-parallel x tensor-parallel tiles of an (E, H, F) tensor: split along dims 0 and 2.
  std::vector<Region> src, dst;
  for (int e = 0; e < 8; ++e) {
    for (int f = 0; f < 8; ++f) src.push_back(Region{{e, 0, 4 * f}, {1, 16, 4}, std::nullopt});
  }
  for (int e = 0; e < 4; ++e) {
    for (int f = 0; f < 16; ++f) dst.push_back(Region{{2 * e, 0, 2 * f}, {2, 16, 2}, std::nullopt});
  }
  EXPECT_EQ(Collect(src, dst), BruteForce(src, dst, false));
  EXPECT_EQ(Collect(src, dst).size(), 128u);  // each dst tile meets 2 src tiles
}

}  // namespace
}  // namespace ckpt
