#include "coordinator/group_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

Operation OpOnHosts(const std::vector<std::string>& hosts, const std::string& groups) {
  Operation op;
  op.id = "op-1";
  op.job = "j";
  op.world_size = static_cast<int>(hosts.size());
  op.ranks.resize(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) op.ranks[r].location.host = hosts[r];
  op.process_groups = groups;
  return op;
}

TEST(GroupPlanTest, SpecCheckNamesTheCallerAndTheBadRankOrGroup) {
  EXPECT_TRUE(CheckProcessGroupSpec("", 4, "job j rank 0").ok());
  EXPECT_TRUE(CheckProcessGroupSpec("per-node", 4, "job j rank 0").ok());
  absl::Status s = CheckProcessGroupSpec("0,1;2,7", 4, "job j rank 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job j rank 2: process group 1 names rank 7"));
  EXPECT_THAT(CheckProcessGroupSpec("nodes", 4, "job j rank 0").message(),
              HasSubstr("job j rank 0: process groups \"nodes\""));
}

TEST(GroupPlanTest, PerNodeGroupsComeFromTheWorkersHosts) {
  const Operation op = OpOnHosts({"a", "b", "a", "b"}, "per-node");
  absl::StatusOr<ProcessGroups> groups = OperationGroups(op);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, (ProcessGroups{{0, 2}, {1, 3}}));
}

TEST(GroupPlanTest, AutoLoadAcrossHostsExchangesWithinEachNode) {
  absl::StatusOr<LoadGroupChoice> choice =
      ChooseLoadGroups(OpOnHosts({"a", "a", "b", "b"}, ""), /*auto_load=*/true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->groups, (ProcessGroups{{0, 1}, {2, 3}}));
  EXPECT_THAT(choice->reason, HasSubstr("span 2 hosts"));
  // Not auto: one group, as before groups existed.
  choice = ChooseLoadGroups(OpOnHosts({"a", "a", "b", "b"}, ""), /*auto_load=*/false);
  EXPECT_EQ(choice->groups, (ProcessGroups{{0, 1, 2, 3}}));
  EXPECT_EQ(choice->reason, "");
  // Declared groups win over auto's per-node choice.
  choice = ChooseLoadGroups(OpOnHosts({"a", "a", "b", "b"}, "data-parallel:2"), true);
  EXPECT_EQ(choice->groups, (ProcessGroups{{0, 2}, {1, 3}}));
  EXPECT_THAT(choice->reason, HasSubstr("process groups data-parallel:2: 2 groups"));
}

TEST(GroupPlanTest, SaveGroupsKeyChangesWithTheSpecAndPerNodeHosts) {
  EXPECT_EQ(SaveGroupsKey(OpOnHosts({"a", "b"}, "")), "");
  EXPECT_EQ(SaveGroupsKey(OpOnHosts({"a", "b"}, "job")), "");
  EXPECT_NE(SaveGroupsKey(OpOnHosts({"a", "b"}, "read-groups:1")),
            SaveGroupsKey(OpOnHosts({"a", "b"}, "read-groups:2")));
  EXPECT_NE(SaveGroupsKey(OpOnHosts({"a", "b"}, "per-node")),
            SaveGroupsKey(OpOnHosts({"a", "a"}, "per-node")));
}

}  // namespace
}  // namespace ckpt::coordinator
