#include "device/device_uuid.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string Uuid(char fill) { return std::string(kDeviceUuidBytes, fill); }

TEST(FormatDeviceUuidTest, SpellsSixteenBytesLikeNvidiaSmi) {
  std::string uuid;
  for (int i = 0; i < 16; ++i) uuid.push_back(static_cast<char>(i * 17));
  EXPECT_EQ(FormatDeviceUuid(uuid), "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

TEST(FormatDeviceUuidTest, SaysWhatIsWrongWithOtherLengths) {
  EXPECT_EQ(FormatDeviceUuid(""), "<no uuid>");
  EXPECT_EQ(FormatDeviceUuid("\x01\x02"), "<2-byte uuid: 0102>");
}

TEST(CheckSameDeviceTest, AcceptsTheSameGpuUnderDifferentOrdinals) {
  // CUDA_VISIBLE_DEVICES=3 in the trainer, all GPUs visible in the worker.
  EXPECT_TRUE(CheckSameDevice("w", Uuid('\x07'), 0, Uuid('\x07'), 3).ok());
}

TEST(CheckSameDeviceTest, RefusesAnotherGpuUnderTheSameOrdinalNamingTensorUuidsAndOrdinals) {
  absl::Status s = CheckSameDevice("layers.0.weight", Uuid('\x01'), 0, Uuid('\x02'), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor layers.0.weight"));
  EXPECT_THAT(s.message(), HasSubstr("GPU-01010101-0101-0101-0101-010101010101 (device 0 in the "
                                     "trainer)"));
  EXPECT_THAT(s.message(), HasSubstr("GPU-02020202-0202-0202-0202-020202020202 (device 0 in the "
                                     "worker)"));
}

TEST(CheckSameDeviceTest, RefusesATrainerThatSentNoUuid) {
  absl::Status s = CheckSameDevice("bias", "", 1, Uuid('\x02'), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor bias"));
  EXPECT_THAT(s.message(), HasSubstr("<no uuid>"));
}

}  // namespace
}  // namespace ckpt
