#include "common/memory_path.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(MemoryPathTest, AcceptsPlainNames) {
  EXPECT_TRUE(IsMemoryPath("mem://step-10"));
  EXPECT_FALSE(IsMemoryPath("/ckpt/mem://x"));
  EXPECT_EQ(*MemoryCheckpointName("mem://step-10_a.b"), "step-10_a.b");
  EXPECT_TRUE(MemoryCheckpointName("mem://" + std::string(128, 'a')).ok());
}

TEST(MemoryPathTest, RefusesHostileNamesNamingThem) {
  for (const std::string& bad : std::vector<std::string>{
           "mem://", "mem://a/b", "mem://../x", "mem://..", "mem://.", "mem://a b", "mem://a\nb",
           "mem://" + std::string(129, 'a'), std::string("mem://a\0b", 9), "/tmp/x"}) {
    absl::StatusOr<std::string> name = MemoryCheckpointName(bad);
    ASSERT_FALSE(name.ok()) << bad;
    EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(MemoryCheckpointName("mem://a/b").status().message().find("a/b"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
