#include "sharding/dtype.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(DTypeTest, NamesRoundTripForEveryDType) {
  for (DType d : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
}

TEST(DTypeTest, ElementSizesMatchSafetensors) {
  EXPECT_EQ(DTypeSize(DType::kBool), 1);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI32), 4);
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kF64), 8);
  EXPECT_EQ(DTypeSize(DType::kU64), 8);
}

TEST(DTypeTest, UnknownNameIsInvalidArgumentListingValidNames) {
  auto parsed = ParseDType("float32");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("float32"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("BF16"), std::string::npos);
}

TEST(DTypeTest, NamesAreCaseSensitive) { EXPECT_FALSE(ParseDType("bf16").ok()); }

}  // namespace
}  // namespace ckpt
