#include "coordinator/transfer_kinds.h"

#include <string>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

TEST(ReceiveKindTest, RefusesUnpublishedNamesAndVersionsNamingThem) {
  MemoryCatalog catalog;
  PublishedRegistry registry;
  TransferPlanCache cache;
  ReceiveKind receive(&catalog, &registry, LoadPlannerOptions{}, &cache);
  Operation op;
  op.id = "op-1";
  op.path = "xfer://policy";
  op.world_size = 1;
  op.ranks.resize(1);
  absl::StatusOr<std::vector<RankPlan>> none = receive.Plan(op);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("xfer://policy"), std::string::npos);
  // Published, but its memory checkpoint is gone from the catalog.
  ASSERT_TRUE(registry.Reserve("policy", 0, "op-0").ok());
  ASSERT_TRUE(registry.Commit("op-0", absl::Now()).ok());
  absl::StatusOr<std::vector<RankPlan>> gone = receive.Plan(op);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("xfer://policy@1"), std::string::npos) << gone.status();
  EXPECT_NE(gone.status().message().find("policy.v1"), std::string::npos) << gone.status();
}

TEST(PublishKindTest, RefusesAVersionNotNewerAndReleasesNothingOfOthers) {
  MemoryCatalog catalog;
  PublishedRegistry registry;
  PublishKind publish(&catalog, &registry);
  ASSERT_TRUE(registry.Reserve("p", 5, "op-0").ok());
  ASSERT_TRUE(registry.Commit("op-0", absl::Now()).ok());
  Operation op;
  op.id = "op-1";
  op.path = "xfer://p@5";
  op.world_size = 1;
  op.ranks.resize(1);
  absl::StatusOr<std::vector<RankPlan>> plans = publish.Plan(op);
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plans.status().message().find("not newer than version 5"), std::string::npos);
  op.path = "xfer://p?verify";
  EXPECT_EQ(publish.Plan(op).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(publish.Finalize(op).ok());
  EXPECT_EQ(registry.Resolve("p", 0)->version, 5);
}

}  // namespace
}  // namespace ckpt::coordinator
