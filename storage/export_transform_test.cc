#include "storage/export_transform.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint16_t ToHalf(DType to, float v) {
  uint16_t out;
  ConvertFloats(DType::kF32, to, reinterpret_cast<const char*>(&v), reinterpret_cast<char*>(&out),
                1);
  return out;
}

uint16_t Bf16(float v) { return ToHalf(DType::kBF16, v); }
uint16_t F16(float v) { return ToHalf(DType::kF16, v); }

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(ConvertFloatsTest, Fp32ToBf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16(-2.5f), 0xc020);
  EXPECT_EQ(Bf16(FromBits(0x3f808000)), 0x3f80);  // halfway, even below
  EXPECT_EQ(Bf16(FromBits(0x3f818000)), 0x3f82);  // halfway, even above
  EXPECT_EQ(Bf16(FromBits(0x3f808001)), 0x3f81);  // just above halfway
  EXPECT_EQ(Bf16(FromBits(0x7f7fffff)), 0x7f80);  // max float rounds to infinity
  EXPECT_EQ(Bf16(FromBits(0x00000001)), 0x0000);  // smallest subnormal rounds to zero
  EXPECT_EQ(Bf16(FromBits(0x00010000)), 0x0001);  // a bf16 subnormal stays
  EXPECT_EQ(Bf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(Bf16(std::nanf("")) & 0x7fc0, 0x7fc0);  // quiet NaN
}

TEST(ConvertFloatsTest, Fp32ToFp16HandlesRangeAndSubnormals) {
  EXPECT_EQ(F16(1.0f), 0x3c00);
  EXPECT_EQ(F16(65504.0f), 0x7bff);
  EXPECT_EQ(F16(65520.0f), 0x7c00);        // rounds to infinity
  EXPECT_EQ(F16(65519.0f), 0x7bff);        // below the halfway point
  EXPECT_EQ(F16(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(F16(2.98e-08f), 0x0000);       // below half of it
  EXPECT_EQ(F16(6.097555e-05f), 0x03ff);   // largest subnormal
  EXPECT_EQ(F16(-3.0f), 0xc200);
}

TEST(ConvertFloatsTest, WideningIsExact) {
  const uint16_t h[] = {0x3c00, 0x0001, 0x7c00, 0xfbff};
  float out[4];
  ConvertFloats(DType::kF16, DType::kF32, reinterpret_cast<const char*>(h),
                reinterpret_cast<char*>(out), 4);
  EXPECT_THAT(out,
              ElementsAre(1.0f, 5.9604645e-08f, std::numeric_limits<float>::infinity(), -65504.0f));
}

TEST(ExportedDTypeTest, OnlyFloatingTensorsConvert) {
  EXPECT_EQ(ExportedDType(DType::kF32, DType::kBF16), DType::kBF16);
  EXPECT_EQ(ExportedDType(DType::kF64, DType::kBF16), DType::kBF16);
  EXPECT_EQ(ExportedDType(DType::kI64, DType::kBF16), DType::kI64);
  EXPECT_EQ(ExportedDType(DType::kF8E4M3, DType::kBF16), DType::kF8E4M3);
  EXPECT_EQ(ExportedDType(DType::kF32, std::nullopt), DType::kF32);
}

TEST(KeyMappingTest, ParsesAndRenames) {
  auto mapping = ParseKeyMapping(R"({"a.w": "model.a.weight", "b": "B"})", "map.json");
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  auto names = RenameKeys({"a.w", "b", "c"}, *mapping);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("model.a.weight", "B", "c"));
}

TEST(KeyMappingTest, RefusesAmbiguousOrUnknownMappings) {
  EXPECT_THAT(ParseKeyMapping("[1]", "m.json").status().message(), HasSubstr("m.json"));
  EXPECT_THAT(ParseKeyMapping(R"({"a": 3})", "m.json").status().message(),
              HasSubstr("\"a\" must map to a non-empty string"));
  EXPECT_THAT(ParseKeyMapping(R"({"a": "x", "b": "x"})", "m.json").status().message(),
              HasSubstr("both map to \"x\""));
  auto mapping = ParseKeyMapping(R"({"a": "c"})", "m.json");
  ASSERT_TRUE(mapping.ok());
  EXPECT_THAT(RenameKeys({"a", "c"}, *mapping).status().message(),
              HasSubstr("would both be exported as \"c\""));
  EXPECT_THAT(RenameKeys({"b"}, *mapping).status().message(),
              HasSubstr("renames \"a\", which the checkpoint does not hold"));
}

}  // namespace
}  // namespace ckpt
