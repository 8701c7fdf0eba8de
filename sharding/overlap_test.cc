#include "sharding/overlap.h"

#include <map>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "sharding/dtype.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using testing::HeldGlobalIndices;
using testing::RandomRegion;
using testing::RandomShape;
using testing::Uniform;

Region Box(std::vector<int64_t> offsets, std::vector<int64_t> lengths,
           std::optional<FlatRange> flat = std::nullopt) {
  return Region{std::move(offsets), std::move(lengths), flat};
}

// (src local, dst local) pairs of every element both pieces hold, in dst order.
std::vector<std::pair<int64_t, int64_t>> BruteForcePairs(const Region& src, const Region& dst,
                                                         absl::Span<const int64_t> shape) {
  std::map<int64_t, int64_t> src_local;  // global index -> src local index
  std::vector<int64_t> s = HeldGlobalIndices(src, shape);
  for (size_t i = 0; i < s.size(); ++i) src_local[s[i]] = i;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  std::vector<int64_t> d = HeldGlobalIndices(dst, shape);
  for (size_t i = 0; i < d.size(); ++i) {
    auto it = src_local.find(d[i]);
    if (it != src_local.end()) pairs.emplace_back(it->second, i);
  }
  return pairs;
}

std::vector<std::pair<int64_t, int64_t>> ExpandRuns(const std::vector<CopyRun>& runs) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const CopyRun& r : runs) {
    for (int64_t i = 0; i < r.length; ++i) pairs.emplace_back(r.src_offset + i, r.dst_offset + i);
  }
  return pairs;
}

TEST(IntersectBoxesTest, OverlappingBoxes) {
  auto r = IntersectBoxes(Box({0, 2}, {4, 4}), Box({2, 0}, {4, 4}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, Box({2, 2}, {2, 2}));
}

TEST(IntersectBoxesTest, TouchingBoxesDoNotIntersect) {
  EXPECT_FALSE(IntersectBoxes(Box({0}, {4}), Box({4}, {4})).has_value());
}

TEST(IntersectBoxesTest, ZeroDimBoxesIntersect) {
  auto r = IntersectBoxes(Box({}, {}), Box({}, {}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->ndim(), 0);
}

TEST(IntersectBoxesTest, FlatRangesAreIgnored) {
  auto r = IntersectBoxes(Box({0}, {8}, FlatRange{0, 1}), Box({0}, {8}, FlatRange{7, 8}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, Box({0}, {8}));
}

TEST(OverlapRunsTest, RowSplitToRowSplitIsOneRun) {
  // (8, 4) tensor: rows [0, 4) into rows [2, 6).
  auto runs = OverlapRuns(Box({0, 0}, {4, 4}), Box({2, 0}, {4, 4}), {8, 4});
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{8, 0, 8}}));
}

TEST(OverlapRunsTest, ColumnSplitGivesOneRunPerRow) {
  auto runs = OverlapRuns(Box({0, 0}, {3, 4}), Box({0, 2}, {3, 2}), {3, 4});
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{2, 0, 2}, {6, 2, 2}, {10, 4, 2}}));
}

TEST(OverlapRunsTest, FlatRangeCutsRunsAtItsEnds) {
  // Whole (4, 4) tensor, flat [5, 11) into column block [:, 2:4].
  auto runs = OverlapRuns(Box({0, 0}, {4, 4}, FlatRange{5, 11}), Box({0, 2}, {4, 2}), {4, 4});
  ASSERT_TRUE(runs.ok()) << runs.status();
  // Elements 6,7 (row 1) and 10 (row 2, col 2); src local = global - 5.
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{1, 2, 2}, {5, 4, 1}}));
}

TEST(OverlapRunsTest, FlatToFlatOfSameBoxIsOneRun) {
  auto runs = OverlapRuns(Box({0, 0}, {4, 4}, FlatRange{3, 12}),
                          Box({0, 0}, {4, 4}, FlatRange{8, 16}), {4, 4});
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{5, 0, 4}}));
}

TEST(OverlapRunsTest, ZeroDimTensorCopiesItsOneElement) {
  auto runs = OverlapRuns(Box({}, {}), Box({}, {}), {});
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{0, 0, 1}}));
  auto none = OverlapRuns(Box({}, {}, FlatRange{0, 0}), Box({}, {}), {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(OverlapRunsTest, InvalidRegionIsAnError) {
  auto runs = OverlapRuns(Box({0}, {5}), Box({0}, {4}), {4});
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kInvalidArgument);
  auto flat = OverlapElements(Box({0}, {4}, FlatRange{2, 5}), Box({0}, {4}), {4});
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
  auto rank = OverlapElements(Box({0}, {4}), Box({0, 0}, {4, 1}), {4});
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OverlapRunsTest, HugeTensorsDoNotOverflow) {
  // 2^31 x 2^31 tensor (2^62 elements): the last element of one flat half-range.
  const int64_t d = int64_t{1} << 31;
  const int64_t total = int64_t{1} << 62;
  Region src = Box({0, 0}, {d, d}, FlatRange{total - 3, total});
  Region dst = Box({d - 1, d - 2}, {1, 2});
  auto runs = OverlapRuns(src, dst, {d, d});
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{1, 0, 2}}));
  auto n = OverlapElements(Box({0, 0}, {d, d}), Box({0, 0}, {d, d}, FlatRange{1, total}), {d, d});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, total - 1);
}

// Property test: runs agree element by element with the brute-force model, are in dst order,
// maximally merged, and OverlapElements equals their total.
TEST(OverlapRunsTest, AgreesWithBruteForceOnRandomRegions) {
  std::mt19937_64 rng(20261121);
  int nonempty = 0;
  for (int iter = 0; iter < 50000; ++iter) {
    std::vector<int64_t> shape = RandomShape(rng, 4, 5);
    Region src = RandomRegion(rng, shape, 0.5);
    Region dst = RandomRegion(rng, shape, 0.5);
    SCOPED_TRACE(ShapeString(shape) + " src " + src.DebugString() + " dst " + dst.DebugString());
    auto runs = OverlapRuns(src, dst, shape);
    ASSERT_TRUE(runs.ok()) << runs.status();
    auto expected = BruteForcePairs(src, dst, shape);
    ASSERT_EQ(ExpandRuns(*runs), expected);
    for (size_t i = 0; i < runs->size(); ++i) {
      ASSERT_GT((*runs)[i].length, 0);
      if (i == 0) continue;
      const CopyRun& a = (*runs)[i - 1];
      const CopyRun& b = (*runs)[i];
      ASSERT_FALSE(a.src_offset + a.length == b.src_offset &&
                   a.dst_offset + a.length == b.dst_offset)
          << "runs " << i - 1 << " and " << i << " should have been merged";
    }
    auto n = OverlapElements(src, dst, shape);
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, static_cast<int64_t>(expected.size()));
    auto sym = OverlapElements(dst, src, shape);
    ASSERT_TRUE(sym.ok());
    ASSERT_EQ(*sym, *n);
    if (!expected.empty()) ++nonempty;
  }
  EXPECT_GT(nonempty, 8000);  // the generator exercises real overlaps
}

TEST(CopyRunsTest, CopiesEveryElementForEveryDTypeSize) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> sizes;
  for (DType d : kAllDTypes) sizes.push_back(DTypeSize(d));
  sizes.push_back(3);  // odd sizes work too
  sizes.push_back(16);
  for (int64_t elem : sizes) {
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<int64_t> shape = RandomShape(rng, 3, 6);
      Region src = RandomRegion(rng, shape, 0.5);
      Region dst = RandomRegion(rng, shape, 0.5);
      auto runs = OverlapRuns(src, dst, shape);
      ASSERT_TRUE(runs.ok()) << runs.status();
      std::vector<int64_t> sg = HeldGlobalIndices(src, shape);
      std::vector<int64_t> dg = HeldGlobalIndices(dst, shape);
      // Element with global index g is the bytes (g*31 + b) & 0xff.
      std::vector<unsigned char> sbuf(sg.size() * elem), dbuf(dg.size() * elem, 0xAB);
      for (size_t i = 0; i < sg.size(); ++i) {
        for (int64_t b = 0; b < elem; ++b) sbuf[i * elem + b] = (sg[i] * 31 + b) & 0xff;
      }
      CopyRuns(*runs, elem, sbuf.data(), dbuf.data());
      std::map<int64_t, bool> in_src;
      for (int64_t g : sg) in_src[g] = true;
      for (size_t i = 0; i < dg.size(); ++i) {
        for (int64_t b = 0; b < elem; ++b) {
          const unsigned char want = in_src.count(dg[i]) ? (dg[i] * 31 + b) & 0xff : 0xAB;
          ASSERT_EQ(dbuf[i * elem + b], want) << "elem size " << elem << " dst element " << i;
        }
      }
    }
  }
}

TEST(CopyRunsTest, EmptyRunListTouchesNothing) {
  unsigned char dst[4] = {1, 2, 3, 4};
  CopyRuns({}, 4, nullptr, dst);
  EXPECT_EQ(dst[0], 1);
}

}  // namespace
}  // namespace ckpt
