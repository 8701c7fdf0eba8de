#include "common/store_url.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(StoreUrlTest, OnlyASchemeOtherThanFileMakesAnObjectStoreUrl) {
  EXPECT_TRUE(IsObjectStoreLocation("s3://bucket/p"));
  EXPECT_EQ(LocationScheme("s3://bucket/p"), "s3");
  EXPECT_FALSE(IsObjectStoreLocation("file:///ckpt/a"));
  EXPECT_FALSE(IsObjectStoreLocation("/ckpt/s3://a"));
  EXPECT_FALSE(IsObjectStoreLocation("relative/step1"));
  EXPECT_FALSE(IsObjectStoreLocation("://x"));
}

TEST(StoreUrlTest, AbsoluteLocationKeepsUrlsAndMakesPathsAbsolute) {
  for (const char* url : {"s3://bucket/ckpts/step1", "mem://step1", "xfer://policy@3", ""}) {
    EXPECT_EQ(AbsoluteLocation(url), url);
  }
  EXPECT_EQ(AbsoluteLocation("runs/step1"),
            (std::filesystem::current_path() / "runs/step1").string());
  EXPECT_EQ(AbsoluteLocation("/ckpt/../x"), "/ckpt/../x");
}

TEST(StoreUrlTest, NormalizeDropsOneTrailingSlashAndRefusesBadComponentsNamingTheUrl) {
  auto normal = NormalizeObjectStoreUrl("s3://bucket/a/b/", "save path");
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(*normal, "s3://bucket/a/b");
  for (const char* bad : {"s3://", "s3:///a", "s3://b//a", "s3://b/a//", "s3://b/./a",
                          "s3://b/a/..", "s3://b/a\tc", "S3://b/a", "file:///a"}) {
    auto refused = NormalizeObjectStoreUrl(bad, "save path");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr(std::string("save path '") + bad + "'"));
  }
}

}  // namespace
}  // namespace ckpt
