#include "worker/region_chunks.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/test_util.h"

namespace ckpt::worker {
namespace {

using ::ckpt::testing::HeldGlobalIndices;

// Property test against the brute-force element model: the chunks, read in order, hold exactly
// the region's elements in its storage order; each is at most the limit and starts where the
// previous one ended.
TEST(RegionChunksTest, ChunksCoverTheRegionContiguouslyInStorageOrder) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int64_t> shape = ::ckpt::testing::RandomShape(rng, 4, 7);
    Region region = ::ckpt::testing::RandomRegion(rng, shape, 0.3);
    const int64_t max_elements = ::ckpt::testing::Uniform(rng, 1, 40);
    std::vector<RegionChunk> chunks = SplitRegion(region, max_elements);
    std::vector<int64_t> joined;
    int64_t next = 0;
    for (const RegionChunk& c : chunks) {
      ASSERT_GT(c.region.NumElements(), 0) << region.DebugString();
      ASSERT_LE(c.region.NumElements(), max_elements) << region.DebugString();
      ASSERT_EQ(c.first_element, next) << region.DebugString();
      next += c.region.NumElements();
      std::vector<int64_t> held = HeldGlobalIndices(c.region, shape);
      joined.insert(joined.end(), held.begin(), held.end());
    }
    ASSERT_EQ(joined, HeldGlobalIndices(region, shape))
        << region.DebugString() << " max " << max_elements;
  }
}

TEST(RegionChunksTest, AFittingRegionIsOneChunkAndAnEmptyOneNone) {
  Region rows{{2, 0}, {3, 4}, std::nullopt};
  std::vector<RegionChunk> one = SplitRegion(rows, 12);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].region, rows);
  EXPECT_TRUE(SplitRegion(Region{{0, 0}, {0, 4}, std::nullopt}, 5).empty());
  // Rows of 4 in slabs of 2 rows; a flat range in ranges of 5.
  EXPECT_EQ(SplitRegion(rows, 9).size(), 2u);
  EXPECT_EQ(SplitRegion(Region{{0}, {12}, FlatRange{1, 12}}, 5).size(), 3u);
}

}  // namespace
}  // namespace ckpt::worker
