#include "sharding/flat_sharding.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "sharding/dtype.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using testing::HeldGlobalIndices;
using testing::Uniform;
using V = std::vector<int64_t>;

std::vector<char> Iota(int64_t n) {
  std::vector<char> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 7 + 1);
  return v;
}

TEST(EvenFlatShardingTest, SplitsLikeTorchChunkOfTheFlattenedTensor) {
  auto spec = EvenFlatSharding({2, 5}, 4);  // 10 elements, chunk 3
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->world_size(), 4);
  EXPECT_EQ(spec->unsharded_flattened_offsets[0][0], (FlatRange{0, 3}));
  EXPECT_EQ(spec->unsharded_flattened_offsets[1][0], (FlatRange{3, 6}));
  EXPECT_EQ(spec->unsharded_flattened_offsets[2][0], (FlatRange{6, 9}));
  EXPECT_EQ(spec->unsharded_flattened_offsets[3][0], (FlatRange{9, 10}));
  EXPECT_EQ(spec->sharded_numels(), (V{3, 3, 3, 1}));
  EXPECT_TRUE(ValidateFlatSharding(*spec, true).ok());
}

TEST(EvenFlatShardingTest, TrailingRanksMayBeEmpty) {
  auto spec = EvenFlatSharding({5}, 4);  // chunk 2: [0,2) [2,4) [4,5) []
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->sharded_numels(), (V{2, 2, 1, 0}));
  auto spec2 = EvenFlatSharding({2}, 8);
  ASSERT_TRUE(spec2.ok());
  EXPECT_EQ(spec2->sharded_numels(), (V{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_TRUE(ValidateFlatSharding(*spec2, true).ok());
  EXPECT_TRUE(FlatShardRegions(*spec2, 5).empty());
}

TEST(EvenFlatShardingTest, ZeroDimAndEmptyTensors) {
  auto scalar = EvenFlatSharding({}, 3);
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->sharded_numels(), (V{1, 0, 0}));
  auto empty = EvenFlatSharding({0, 4}, 3);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->sharded_numels(), (V{0, 0, 0}));
  EXPECT_TRUE(ValidateFlatSharding(*empty, true).ok());
  EXPECT_FALSE(EvenFlatSharding({4}, 0).ok());
  EXPECT_FALSE(EvenFlatSharding({-4}, 2).ok());
}

// Property: EvenFlatRange gives each rank exactly the elements torch.chunk of the flattened
// tensor gives it, found element by element (element i belongs to chunk i / ceil(n / m)).
TEST(EvenFlatRangeTest, MatchesElementByElementTorchChunk) {
  for (int64_t numel = 0; numel <= 70; ++numel) {
    for (int64_t world = 1; world <= 40; ++world) {
      const int64_t chunk = (numel + world - 1) / world;
      for (int64_t rank = 0; rank < world; ++rank) {
        int64_t first = numel, last = numel;  // empty ranges sit at the end
        for (int64_t i = 0; i < numel; ++i) {
          if (i / chunk != rank) continue;
          if (first == numel) first = i;
          last = i + 1;
        }
        auto range = EvenFlatRange(numel, world, rank);
        ASSERT_TRUE(range.ok()) << range.status();
        if (first == numel) {
          EXPECT_EQ(range->size(), 0) << numel << " " << world << " " << rank;
        } else {
          EXPECT_EQ(*range, (FlatRange{first, last})) << numel << " " << world << " " << rank;
        }
      }
    }
  }
}

TEST(EvenFlatRangeTest, ExtremeSizesDoNotOverflowAndBadArgumentsAreErrors) {
  const int64_t max = kMaxElements;
  auto last = EvenFlatRange(max, int64_t{1} << 20, (int64_t{1} << 20) - 1);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->stop, max);
  EXPECT_EQ(last->size(), max >> 20);
  auto tiny = EvenFlatRange(3, int64_t{1} << 40, (int64_t{1} << 40) - 1);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->size(), 0);
  EXPECT_FALSE(EvenFlatRange(10, 0, 0).ok());
  EXPECT_FALSE(EvenFlatRange(10, 4, 4).ok());
  EXPECT_FALSE(EvenFlatRange(10, 4, -1).ok());
  EXPECT_FALSE(EvenFlatRange(-1, 4, 0).ok());
  EXPECT_FALSE(EvenFlatRange(max + 1, 4, 0).ok());
}

TEST(ValidateFlatShardingTest, ReportsOverlapsHolesAndBadRanges) {
  FlatShardingSpec spec{{10}, {{{0, 4}}, {{3, 10}}}};
  absl::Status s = ValidateFlatSharding(spec, true);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("overlap"), absl::string_view::npos) << s;
  EXPECT_TRUE(ValidateFlatSharding(spec, false).ok());
  spec = FlatShardingSpec{{10}, {{{0, 4}}, {{5, 10}}}};
  s = ValidateFlatSharding(spec, true);
  EXPECT_NE(s.message().find("[4, 5)"), absl::string_view::npos) << s;
  spec = FlatShardingSpec{{10}, {{{0, 4}}, {{4, 9}}}};
  EXPECT_FALSE(ValidateFlatSharding(spec, true).ok());
  spec = FlatShardingSpec{{10}, {{{0, 11}}}};
  EXPECT_FALSE(ValidateFlatSharding(spec, false).ok());
  spec = FlatShardingSpec{{10}, {{{5, 4}}}};
  EXPECT_FALSE(ValidateFlatSharding(spec, false).ok());
}

TEST(ShardedChunkTest, ConcatenatesTheRanksRanges) {
  // OLMo-core allows several ranges per rank.
  FlatShardingSpec spec{{3, 4}, {{{0, 2}, {10, 12}}, {{2, 10}}}};
  ASSERT_TRUE(ValidateFlatSharding(spec, true).ok());
  std::vector<char> data = Iota(12 * 2);
  auto chunk = ShardedChunk(spec, 0, 2, data);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  std::vector<char> want(data.begin(), data.begin() + 4);
  want.insert(want.end(), data.begin() + 20, data.begin() + 24);
  EXPECT_EQ(*chunk, want);
  EXPECT_FALSE(ShardedChunk(spec, 2, 2, data).ok());  // rank out of range
  EXPECT_FALSE(ShardedChunk(spec, 0, 4, data).ok());  // buffer size mismatch
  auto runs = ShardedChunkRuns(FlatShardingSpec{{8}, {{{0, 2}, {2, 5}}}}, 0);
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(*runs, (std::vector<CopyRun>{{0, 0, 5}}));  // adjacent ranges merge
}

TEST(ChunkUnshardedTest, PadsToTheLargestShardAndUnshardInverts) {
  std::mt19937_64 rng(5);
  for (DType dtype : kAllDTypes) {
    const int64_t elem = DTypeSize(dtype);
    for (int iter = 0; iter < 30; ++iter) {
      V shape = testing::RandomShape(rng, 3, 7);
      const int world = Uniform(rng, 1, 9);
      auto spec = EvenFlatSharding(shape, world);
      ASSERT_TRUE(spec.ok());
      const int64_t numel = WholeRegion(shape).BoxElements();
      std::vector<char> data = Iota(numel * elem);
      auto padded = ChunkUnsharded(*spec, elem, data, /*pad=*/true);
      ASSERT_TRUE(padded.ok()) << padded.status();
      const int64_t chunk = (numel + world - 1) / world;
      const std::vector<int64_t> numels = spec->sharded_numels();
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ((int64_t)(*padded)[r].size(), chunk * elem);
        for (int64_t b = numels[r] * elem; b < chunk * elem; ++b) ASSERT_EQ((*padded)[r][b], 0);
      }
      auto unpadded = ChunkUnsharded(*spec, elem, data, /*pad=*/false);
      ASSERT_TRUE(unpadded.ok());
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ((int64_t)(*unpadded)[r].size(), numels[r] * elem);
      }
      auto back = Unshard(*spec, elem, *padded);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, data);
    }
  }
}

TEST(FlatRangeToBoxesTest, ExampleDecomposition) {
  // (4, 5) box, flat [3, 17): the rest of row 0, rows 1-2, and the head of row 3.
  Region box{{0, 0}, {4, 5}, std::nullopt};
  auto subs = FlatRangeToBoxes(box, FlatRange{3, 17});
  ASSERT_EQ(subs.size(), 3u);
  EXPECT_EQ(subs[0].box, (Region{{0, 3}, {1, 2}, std::nullopt}));
  EXPECT_EQ(subs[0].local_start, 0);
  EXPECT_EQ(subs[1].box, (Region{{1, 0}, {2, 5}, std::nullopt}));
  EXPECT_EQ(subs[1].local_start, 2);
  EXPECT_EQ(subs[2].box, (Region{{3, 0}, {1, 2}, std::nullopt}));
  EXPECT_EQ(subs[2].local_start, 12);
}

TEST(FlatRangeToBoxesTest, AgreesWithBruteForceAndStaysSmall) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 20000; ++iter) {
    V shape = testing::RandomShape(rng, 4, 5);
    Region region = testing::RandomRegion(rng, shape, 1.0);
    SCOPED_TRACE(ShapeString(shape) + " " + region.DebugString());
    const FlatRange range = *region.flat;
    Region box = region;
    box.flat.reset();
    auto subs = FlatRangeToBoxes(box, range);
    ASSERT_LE(subs.size(), std::max<size_t>(1, 2 * shape.size() - 1));
    std::vector<int64_t> got;
    int64_t expected_start = 0;
    for (const FlatSubBox& sub : subs) {
      ASSERT_FALSE(sub.box.flat.has_value());
      ASSERT_TRUE(ValidateRegion(sub.box, shape).ok());
      ASSERT_GT(sub.box.BoxElements(), 0);
      ASSERT_EQ(sub.local_start, expected_start);
      expected_start += sub.box.BoxElements();
      auto idx = HeldGlobalIndices(sub.box, shape);
      got.insert(got.end(), idx.begin(), idx.end());
    }
    ASSERT_EQ(got, HeldGlobalIndices(region, shape));
  }
}

TEST(FlatBufferShardingTest, SplitsTheConcatenationEvenlyWithEndPadding) {
  // Tensors of 5, 0, 6 elements = 11, world 4 -> padded to 12, 3 per rank.
  auto slices = FlatBufferSharding({5, 0, 6}, 4);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 4u);
  ASSERT_EQ((*slices)[0].size(), 1u);
  EXPECT_EQ((*slices)[0][0].tensor, 0);
  EXPECT_EQ((*slices)[0][0].range, (FlatRange{0, 3}));
  ASSERT_EQ((*slices)[1].size(), 2u);
  EXPECT_EQ((*slices)[1][0].range, (FlatRange{3, 5}));
  EXPECT_EQ((*slices)[1][1].tensor, 2);
  EXPECT_EQ((*slices)[1][1].range, (FlatRange{0, 1}));
  EXPECT_EQ((*slices)[1][1].buffer_offset, 2);
  ASSERT_EQ((*slices)[3].size(), 1u);
  EXPECT_EQ((*slices)[3][0].range, (FlatRange{4, 6}));  // 2 elements + 1 padding
  EXPECT_FALSE(FlatBufferSharding({1}, 0).ok());
  EXPECT_FALSE(FlatBufferSharding({-1}, 2).ok());
}

TEST(FlatBufferShardingTest, EveryTensorElementIsOwnedOnce) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    V numels(Uniform(rng, 0, 6));
    for (int64_t& n : numels) n = Uniform(rng, 0, 20);
    const int world = Uniform(rng, 1, 8);
    auto slices = FlatBufferSharding(numels, world);
    ASSERT_TRUE(slices.ok());
    std::vector<std::vector<int>> owned(numels.size());
    for (size_t t = 0; t < numels.size(); ++t) owned[t].assign(numels[t], 0);
    const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
    const int64_t per = (total + world - 1) / world;
    for (int r = 0; r < world; ++r) {
      int64_t local = 0;
      for (const BufferSlice& s : (*slices)[r]) {
        ASSERT_EQ(s.buffer_offset, local);
        ASSERT_GT(s.range.size(), 0);
        for (int64_t i = s.range.start; i < s.range.stop; ++i) ++owned[s.tensor][i];
        local += s.range.size();
      }
      ASSERT_LE(local, per);
    }
    for (const auto& o : owned) {
      for (int c : o) ASSERT_EQ(c, 1);
    }
  }
}

}  // namespace
}  // namespace ckpt
