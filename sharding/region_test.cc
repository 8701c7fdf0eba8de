#include "sharding/region.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

Region Box(std::vector<int64_t> offsets, std::vector<int64_t> lengths,
           std::optional<FlatRange> flat = std::nullopt) {
  return Region{std::move(offsets), std::move(lengths), flat};
}

bool Mentions(const absl::Status& s, absl::string_view text) {
  return s.message().find(text) != absl::string_view::npos;
}

TEST(RegionTest, WholeRegionCoversTheShape) {
  Region r = WholeRegion({3, 4});
  EXPECT_EQ(r, Box({0, 0}, {3, 4}));
  EXPECT_EQ(r.BoxElements(), 12);
  EXPECT_EQ(r.NumElements(), 12);
  EXPECT_TRUE(ValidateRegion(r, {3, 4}).ok());
}

TEST(RegionTest, ZeroDimRegionHasOneElement) {
  Region r = WholeRegion({});
  EXPECT_EQ(r.BoxElements(), 1);
  EXPECT_TRUE(ValidateRegion(r, {}).ok());
  EXPECT_TRUE(ValidateRegion(Box({}, {}, FlatRange{0, 1}), {}).ok());
  EXPECT_FALSE(ValidateRegion(Box({}, {}, FlatRange{0, 2}), {}).ok());
}

TEST(RegionTest, NumElementsIsTheFlatRangeSize) {
  EXPECT_EQ(Box({0, 0}, {4, 4}, FlatRange{3, 10}).NumElements(), 7);
}

TEST(RegionTest, DebugStringShowsBoxAndFlatRange) {
  EXPECT_EQ(Box({0, 8}, {4, 8}).DebugString(), "[0:4, 8:16]");
  EXPECT_EQ(Box({0, 8}, {4, 8}, FlatRange{3, 40}).DebugString(), "[0:4, 8:16] flat[3:40)");
}

TEST(RegionTest, ShapeStringMatchesPython) {
  EXPECT_EQ(ShapeString({}), "()");
  EXPECT_EQ(ShapeString({5}), "(5,)");
  EXPECT_EQ(ShapeString({2, 3}), "(2, 3)");
}

TEST(RegionTest, ZeroSizedDimsAreValid) {
  EXPECT_TRUE(ValidateRegion(Box({0, 0}, {0, 4}), {0, 4}).ok());
  EXPECT_TRUE(ValidateRegion(Box({3, 0}, {0, 4}), {3, 4}).ok());  // empty box at the end
  EXPECT_TRUE(ValidateRegion(Box({0, 0}, {0, 4}, FlatRange{0, 0}), {0, 4}).ok());
}

TEST(RegionTest, RankMismatchIsRejected) {
  absl::Status s = ValidateRegion(Box({0}, {4}), {4, 4});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "(4, 4)")) << s;
  EXPECT_FALSE(ValidateRegion(Box({0, 0}, {4}), {4}).ok());  // offsets vs lengths
}

TEST(RegionTest, NegativeValuesAreRejected) {
  EXPECT_FALSE(ValidateRegion(Box({-1}, {2}), {4}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0}, {-1}), {4}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0}, {4}, FlatRange{-1, 2}), {4}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0}, {4}, FlatRange{3, 2}), {4}).ok());
  EXPECT_FALSE(CheckedNumElements({3, -2}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0}, {0}), {-1}).ok());
}

TEST(RegionTest, OutOfBoundsNamesTheDimension) {
  absl::Status s = ValidateRegion(Box({0, 2}, {4, 3}), {4, 4});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "dim 1")) << s;
  EXPECT_FALSE(ValidateRegion(Box({5}, {0}), {4}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0}, {4}, FlatRange{0, 5}), {4}).ok());
}

TEST(RegionTest, OffsetPlusLengthOverflowIsRejectedNotWrapped) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(ValidateRegion(Box({big}, {big}), {big}).ok());
  EXPECT_FALSE(ValidateRegion(Box({2}, {big - 1}), {big}).ok());
}

TEST(RegionTest, ElementCountsUpToTwoToTheSixtyTwoAreAccepted) {
  const int64_t d = int64_t{1} << 31;
  auto n = CheckedNumElements({d, d});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, kMaxElements);
  EXPECT_TRUE(ValidateRegion(Box({0, 0}, {d, d}, FlatRange{0, kMaxElements}), {d, d}).ok());
  EXPECT_FALSE(CheckedNumElements({d, d, 2}).ok());
  EXPECT_FALSE(CheckedNumElements({kMaxElements + 1}).ok());
  // A product that would wrap int64 is caught before it is computed.
  EXPECT_FALSE(CheckedNumElements({int64_t{1} << 40, int64_t{1} << 40}).ok());
  EXPECT_FALSE(ValidateRegion(Box({0, 0}, {0, 0}), {int64_t{1} << 40, int64_t{1} << 40}).ok());
  // A zero dim makes the product 0 regardless of the others, without overflowing on the way.
  const int64_t t40 = int64_t{1} << 40;
  Region flat_zero = Box({0, 0, 0}, {t40, t40, 0});
  EXPECT_TRUE(ValidateRegion(flat_zero, {t40, t40, 0}).ok());
  EXPECT_EQ(flat_zero.BoxElements(), 0);
  auto zero = CheckedNumElements({int64_t{1} << 40, 0, int64_t{1} << 40});
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0);
}

}  // namespace
}  // namespace ckpt
