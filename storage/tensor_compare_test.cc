#include "storage/tensor_compare.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TensorDescription T(std::string key, DType dtype, std::vector<int64_t> shape) {
  return TensorDescription{std::move(key), dtype, std::move(shape)};
}

TEST(DiffTensorListsTest, SortsKeysIntoMissingMismatchedAndComparable) {
  TensorListDiff d = DiffTensorLists({T("w", DType::kF32, {4}), T("a", DType::kF32, {2}),
                                      T("s", DType::kBF16, {3}), T("d", DType::kF32, {2, 2})},
                                     {T("s", DType::kBF16, {3}), T("b", DType::kF32, {2}),
                                      T("w", DType::kF16, {4}), T("d", DType::kF32, {4})});
  EXPECT_THAT(d.only_in_a, ElementsAre("a"));
  EXPECT_THAT(d.only_in_b, ElementsAre("b"));
  ASSERT_EQ(d.mismatched.size(), 2u);
  EXPECT_EQ(d.mismatched[0].first.key, "d");
  EXPECT_EQ(d.mismatched[0].second.shape, std::vector<int64_t>{4});
  EXPECT_EQ(d.mismatched[1].second.dtype, DType::kF16);
  ASSERT_EQ(d.comparable.size(), 1u);
  EXPECT_EQ(d.comparable[0].key, "s");
}

TEST(DiffTensorListsTest, EmptyListsHaveNothingToReport) {
  TensorListDiff d = DiffTensorLists({}, {});
  EXPECT_TRUE(d.only_in_a.empty() && d.only_in_b.empty() && d.mismatched.empty() &&
              d.comparable.empty());
}

TEST(ElementChunksTest, CoverTheTensorInOrderWithinTheLimit) {
  EXPECT_THAT(ElementChunks(10, 4), ElementsAre(Pair(0, 4), Pair(4, 8), Pair(8, 10)));
  EXPECT_THAT(ElementChunks(4, 4), ElementsAre(Pair(0, 4)));
  EXPECT_TRUE(ElementChunks(0, 4).empty());
  EXPECT_THAT(ElementChunks(2, 0), ElementsAre(Pair(0, 1), Pair(1, 2)));  // at least one
}

TEST(UnravelIndexTest, IsRowMajor) {
  EXPECT_THAT(UnravelIndex({2, 3, 4}, 0), ElementsAre(0, 0, 0));
  EXPECT_THAT(UnravelIndex({2, 3, 4}, 23), ElementsAre(1, 2, 3));
  EXPECT_THAT(UnravelIndex({2, 3, 4}, 13), ElementsAre(1, 0, 1));
  EXPECT_TRUE(UnravelIndex({}, 0).empty());
}

template <typename T>
std::string Bytes(const T& v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

TEST(FormatElementTest, ShowsValuesAndBits) {
  EXPECT_EQ(FormatElement(DType::kF32, Bytes(1.5f).data()), "1.5 (0x3fc00000)");
  EXPECT_EQ(FormatElement(DType::kBF16, Bytes(uint16_t{0x3fc0}).data()), "1.5 (0x3fc0)");
  EXPECT_EQ(FormatElement(DType::kF16, Bytes(uint16_t{0x3e00}).data()), "1.5 (0x3e00)");
  EXPECT_EQ(FormatElement(DType::kF16, Bytes(uint16_t{0x0001}).data()),
            "5.9604644775390625e-08 (0x0001)");  // smallest subnormal
  EXPECT_EQ(FormatElement(DType::kF16, Bytes(uint16_t{0xfc00}).data()), "-inf (0xfc00)");
  EXPECT_EQ(FormatElement(DType::kF8E4M3, Bytes(uint8_t{0x7e}).data()), "448 (0x7e)");
  EXPECT_EQ(FormatElement(DType::kF8E4M3, Bytes(uint8_t{0x7f}).data()), "nan (0x7f)");
  EXPECT_EQ(FormatElement(DType::kF8E5M2, Bytes(uint8_t{0x7c}).data()), "inf (0x7c)");
  EXPECT_EQ(FormatElement(DType::kF8E8M0, Bytes(uint8_t{128}).data()), "2 (0x80)");
  EXPECT_EQ(FormatElement(DType::kI64, Bytes(int64_t{-7}).data()), "-7");
  EXPECT_EQ(FormatElement(DType::kU64, Bytes(~uint64_t{0}).data()), "18446744073709551615");
  EXPECT_EQ(FormatElement(DType::kBool, Bytes(uint8_t{1}).data()), "true");
  EXPECT_EQ(FormatElement(DType::kBool, Bytes(uint8_t{2}).data()), "0x02");
  std::string c = Bytes(1.0f) + Bytes(-2.0f);
  EXPECT_EQ(FormatElement(DType::kC64, c.data()), "(1, -2) (0xc00000003f800000)");
}

std::string Floats(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

TEST(TensorComparisonTest, CountsDifferencesAndKeepsTheFirstAcrossChunks) {
  TensorComparison c(DType::kF32);
  const std::string a1 = Floats({1, 2, 3}), b1 = Floats({1, 2, 3});
  const std::string a2 = Floats({4, 5, 6}), b2 = Floats({4, 5.5f, 8});
  c.AddChunk(0, a1, b1);
  EXPECT_EQ(c.result().differing, 0);
  EXPECT_EQ(c.result().first_index, -1);
  c.AddChunk(3, a2, b2);
  EXPECT_EQ(c.result().differing, 2);
  EXPECT_EQ(c.result().first_index, 4);
  EXPECT_EQ(c.result().first_a, "5 (0x40a00000)");
  EXPECT_EQ(c.result().first_b, "5.5 (0x40b00000)");
  EXPECT_EQ(c.result().max_abs_difference, 2.0);
  EXPECT_FALSE(c.result().non_finite_difference);
}

TEST(TensorComparisonTest, IsBitwiseForSignedZerosAndNans) {
  TensorComparison c(DType::kF32);
  const float nan = std::nanf("");
  c.AddChunk(0, Floats({0.0f, nan, nan}), Floats({-0.0f, nan, -nan}));
  EXPECT_EQ(c.result().differing, 2);  // +0 vs -0, and the NaNs of different sign
  EXPECT_EQ(c.result().first_index, 0);
  EXPECT_EQ(c.result().max_abs_difference, 0.0);
  EXPECT_TRUE(c.result().non_finite_difference);
}

TEST(TensorComparisonTest, IntegersHaveNoAbsoluteDifference) {
  TensorComparison c(DType::kI64);
  c.AddChunk(0, Bytes(int64_t{3}), Bytes(int64_t{4}));
  EXPECT_EQ(c.result().differing, 1);
  EXPECT_FALSE(c.result().max_abs_difference.has_value());
}

// Property: against a brute-force element-by-element twin on random buffers and chunkings.
TEST(TensorComparisonTest, MatchesElementByElementComparison) {
  std::mt19937_64 rng(15);
  for (int trial = 0; trial < 300; ++trial) {
    const DType dtype = trial % 3 == 0 ? DType::kBF16 : (trial % 3 == 1 ? DType::kF32 : DType::kU8);
    const int64_t size = DTypeSize(dtype);
    const int64_t n = static_cast<int64_t>(rng() % 200);
    std::string a(n * size, '\0'), b;
    for (char& ch : a) ch = static_cast<char>(rng() % 4);
    b = a;
    for (int k = static_cast<int>(rng() % 6); k > 0 && n > 0; --k) {
      b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 3);
    }
    int64_t expected_count = 0, expected_first = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (a.compare(i * size, size, b, i * size, size) != 0) {
        if (expected_first < 0) expected_first = i;
        ++expected_count;
      }
    }
    TensorComparison c(dtype);
    for (auto [start, stop] : ElementChunks(n, 1 + static_cast<int64_t>(rng() % 50))) {
      c.AddChunk(start, absl::string_view(a).substr(start * size, (stop - start) * size),
                 absl::string_view(b).substr(start * size, (stop - start) * size));
    }
    ASSERT_EQ(c.result().differing, expected_count) << "trial " << trial;
    ASSERT_EQ(c.result().first_index, expected_first) << "trial " << trial;
  }
}

}  // namespace
}  // namespace ckpt
