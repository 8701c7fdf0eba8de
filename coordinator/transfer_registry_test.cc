#include "coordinator/transfer_registry.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

TEST(PublishedRegistryTest, PublishedVersionsAreKeptAsMemoryCheckpointsNamedByVersion) {
  EXPECT_EQ(PublishedCheckpointName("p", 3), "p.v3");
}

TEST(PublishedRegistryTest, VersionsOnlyGrowAndTheNewestKAreKept) {
  PublishedRegistry registry(/*keep_versions=*/2);
  EXPECT_EQ(registry.Resolve("p", 0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(*registry.Reserve("p", 0, "op-1"), 1);
  EXPECT_EQ(*registry.Reserve("p", 0, "op-1"), 1);  // idempotent
  // A second publish in flight gets the next version; an explicit older one is refused.
  ASSERT_EQ(*registry.Reserve("p", 0, "op-2"), 2);
  absl::StatusOr<int64_t> stale = registry.Reserve("p", 2, "op-3");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("xfer://p@2"), std::string::npos);
  ASSERT_TRUE(registry.Commit("op-1", absl::Now()).ok());
  registry.Release("op-2");  // that publish failed: its version is free again
  EXPECT_EQ(registry.Resolve("p", 0)->version, 1);
  ASSERT_EQ(*registry.Reserve("p", 10, "op-4"), 10);
  ASSERT_TRUE(registry.Commit("op-4", absl::Now()).ok());
  ASSERT_EQ(*registry.Reserve("p", 0, "op-5"), 11);
  absl::StatusOr<std::vector<PublishedVersion>> forgotten = registry.Commit("op-5", absl::Now());
  ASSERT_TRUE(forgotten.ok());
  ASSERT_EQ(forgotten->size(), 1u);
  EXPECT_EQ((*forgotten)[0].version, 1);
  EXPECT_EQ(registry.Resolve("p", 0)->memory_checkpoint, "p.v11");
  EXPECT_EQ(registry.Resolve("p", 10)->version, 10);
  absl::StatusOr<PublishedVersion> gone = registry.Resolve("p", 1);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("kept versions: 10, 11"), std::string::npos)
      << gone.status();
  EXPECT_EQ(registry.Commit("op-never", absl::Now()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.List().at("p").size(), 2u);
}

TEST(PublishedRegistryTest, AdoptedVersionsAreListedInOrderAndTheNewestKKept) {
  PublishedRegistry registry(/*keep_versions=*/2);  // a restarted coordinator's
  EXPECT_TRUE(registry.Adopt("p", 7, absl::FromUnixMillis(7)));
  EXPECT_FALSE(registry.Adopt("p", 7, absl::FromUnixMillis(7)));  // a second holder's report
  EXPECT_TRUE(registry.Adopt("p", 5, absl::FromUnixMillis(5)));
  EXPECT_FALSE(registry.Adopt("p", 3, absl::FromUnixMillis(3)));  // older than the newest 2
  EXPECT_EQ(registry.Resolve("p", 0)->memory_checkpoint, "p.v7");
  EXPECT_EQ(registry.Resolve("p", 5)->version, 5);
  // Versions still only grow past what the workers brought back.
  EXPECT_EQ(registry.Reserve("p", 6, "op-1").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*registry.Reserve("p", 0, "op-1"), 8);
}

TEST(PublishedRegistryTest, RefusesNegativeVersionsAndOnePastTheLargest) {
  PublishedRegistry registry(/*keep_versions=*/2);
  absl::StatusOr<int64_t> negative = registry.Reserve("p", -7, "op-1");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument) << negative.status();
  EXPECT_NE(negative.status().message().find("version -7 of xfer://p"), std::string::npos)
      << negative.status();
  EXPECT_EQ(registry.Reserved("op-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(registry.Adopt("p", -7, absl::Now()));
  EXPECT_FALSE(registry.Adopt("p", 0, absl::Now()));
  EXPECT_TRUE(registry.List().empty() || registry.List().at("p").empty());
  ASSERT_EQ(*registry.Reserve("p", INT64_MAX, "op-2"), INT64_MAX);
  // The next one would overflow: refused whether the largest is reserved or published.
  absl::StatusOr<int64_t> overflow = registry.Reserve("p", 0, "op-3");
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument) << overflow.status();
  EXPECT_NE(overflow.status().message().find("xfer://p"), std::string::npos);
  EXPECT_NE(overflow.status().message().find("9223372036854775807"), std::string::npos);
  ASSERT_TRUE(registry.Commit("op-2", absl::Now()).ok());
  EXPECT_EQ(registry.Reserve("p", 0, "op-3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Resolve("p", 0)->version, INT64_MAX);
}

}  // namespace
}  // namespace ckpt::coordinator
