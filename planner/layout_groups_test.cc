#include "planner/layout_groups.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout_spec.h"
#include "planner/save_plan.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string Layout(const std::string& groups) {
  return R"json({"mesh": {"dp": 2, "tp": 2}, "rules": [{"match": "*",
            "placements": ["Replicate()", "Shard(0)"]}], "process_groups": )json" +
         groups + "}";
}

ProcessGroups GroupsOf(const std::string& groups) {
  absl::StatusOr<LayoutSpec> spec = LayoutSpec::Parse(Layout(groups));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? spec->process_groups() : ProcessGroups{};
}

TEST(LayoutGroupsTest, EveryFormResolvesOverTheMeshRanks) {
  using G = ProcessGroups;
  EXPECT_EQ(GroupsOf(R"({"along": ["dp"]})"), (G{{0, 2}, {1, 3}}));  // data-parallel groups
  EXPECT_EQ(GroupsOf(R"({"along": ["tp"]})"), (G{{0, 1}, {2, 3}}));  // one per model replica
  EXPECT_EQ(GroupsOf(R"({"along": ["dp", "tp"]})"), (G{{0, 1, 2, 3}}));
  EXPECT_EQ(GroupsOf(R"("read-groups:2")"), (G{{0, 1}, {2, 3}}));
  EXPECT_EQ(GroupsOf(R"([[3, 0], [1, 2]])"), (G{{0, 3}, {1, 2}}));
  absl::StatusOr<LayoutSpec> none = LayoutSpec::Parse(
      R"json({"mesh": {"tp": 2}, "rules": [{"match": "*", "placements": ["Shard(0)"]}]})json");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->process_groups().empty());
}

TEST(LayoutGroupsTest, BadGroupsAreRefusedNamingThePathRankOrGroup) {
  auto error = [](const std::string& groups) {
    return std::string(LayoutSpec::Parse(Layout(groups)).status().message());
  };
  EXPECT_THAT(error(R"({"along": ["pp"]})"),
              HasSubstr("layout process_groups.along[0]: \"pp\" is not a mesh dim (dp, tp)"));
  EXPECT_THAT(error(R"({"over": ["dp"]})"), HasSubstr("process_groups.over: unknown field"));
  EXPECT_THAT(error(R"([[0, 1], [2, 4]])"), HasSubstr("process group 1 names rank 4"));
  EXPECT_THAT(error(R"([[0, 1], [2]])"), HasSubstr("rank 3 is in no process group"));
  EXPECT_THAT(error(R"([[0, 1], ["2", 3]])"), HasSubstr("process_groups[1][0]: expected a rank"));
  EXPECT_THAT(error(R"("per-node")"), HasSubstr("per-node groups come from the workers' hosts"));
  EXPECT_THAT(error(R"("read-groups:3")"), HasSubstr("does not divide"));
  EXPECT_THAT(error("7"), HasSubstr("expected a spec string"));
}

// The layout's groups reach the save plan of a reshard into it: every tensor is replicated
// everywhere with its main replica on rank 0, so with the data-parallel groups (along dp)
// {0, 2} and {1, 3} only the first group writes.
TEST(LayoutGroupsTest, ALayoutsGroupsDistributeItsWrites) {
  absl::StatusOr<LayoutSpec> spec = LayoutSpec::Parse(R"json({"mesh": {"dp": 2, "tp": 2},
      "rules": [{"match": "*", "placements": ["Replicate()", "Replicate()"]}],
      "process_groups": {"along": ["dp"]}})json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<TensorMeta> tensors;
  for (const char* key : {"a", "b", "c", "d"}) tensors.push_back({key, DType::kF32, {8}});
  absl::StatusOr<std::vector<TensorPiece>> pieces = spec->AllPieces(tensors);
  ASSERT_TRUE(pieces.ok());
  SavePlanOptions options;
  options.groups = spec->process_groups();
  absl::StatusOr<SavePlan> plan = BuildSavePlan(*pieces, 4, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Every tensor's main replica is rank 0 (all coordinates 0): only group {0, 2} writes, its
  // two ranks sharing the four tensors; without groups all four ranks would.
  ASSERT_EQ(plan->writers.size(), 2u);
  EXPECT_EQ(plan->writers[0].rank, 0);
  EXPECT_EQ(plan->writers[1].rank, 2);
  absl::StatusOr<SavePlan> ungrouped = BuildSavePlan(*pieces, 4);
  ASSERT_TRUE(ungrouped.ok());
  EXPECT_EQ(ungrouped->writers.size(), 4u);
}

}  // namespace
}  // namespace ckpt
