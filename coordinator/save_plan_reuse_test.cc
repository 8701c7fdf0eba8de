#include "coordinator/save_plan_reuse.h"

#include <string>
#include <vector>

#include "coordinator/clock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {
namespace {

Operation Save(const std::string& job, const std::vector<std::string>& digests) {
  Operation op;
  op.id = "op-" + job;
  op.job = job;
  op.world_size = static_cast<int>(digests.size());
  op.ranks.resize(digests.size());
  for (size_t r = 0; r < digests.size(); ++r) op.ranks[r].description_digest = digests[r];
  return op;
}

std::vector<RankPlan> Plans(const std::string& staging) {
  std::vector<RankPlan> plans;
  for (int r = 0; r < 2; ++r) {
    pb::SavePlanPart part;
    part.set_rank(r);
    part.set_total_bytes(100 * (r + 1));
    part.set_staging_dir(staging);
    part.add_files()->set_path("data/" + std::to_string(r));
    plans.push_back({part.SerializeAsString(), part.total_bytes()});
  }
  return plans;
}

// Keeps a copy of `plans` (Keep names the bodies of the plans it is given).
void KeepPlans(SavePlanReuse& reuse, const Operation& op, std::vector<RankPlan> plans) {
  reuse.Keep(op, &plans);
}

TEST(SavePlanReuseTest, ARepeatSaveOfUnchangedRanksGetsThePlanWithItsOwnStagingDir) {
  SavePlanReuse reuse;
  KeepPlans(reuse, Save("j", {"a", "b"}), Plans("/ckpt/1.staging"));
  auto again = reuse.Find(Save("j", {"a", "b"}), "/ckpt/2.staging");
  ASSERT_TRUE(again.has_value());
  ASSERT_EQ(again->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    pb::SavePlanPart part;
    ASSERT_TRUE(part.ParseFromString((*again)[r].part.Bytes()));
    EXPECT_EQ(part.staging_dir(), "/ckpt/2.staging");
    EXPECT_EQ(part.rank(), r);
    EXPECT_EQ(part.files(0).path(), "data/" + std::to_string(r));
    EXPECT_EQ((*again)[r].bytes, 100 * (r + 1));
  }
  EXPECT_EQ(reuse.reused(), 1);
}

TEST(SavePlanReuseTest, AReusedPlanIsMarkedReusedSoTheOperationReportsIt) {
  SavePlanReuse reuse;
  std::vector<RankPlan> first = Plans("/ckpt/1.staging");
  for (const RankPlan& plan : first) EXPECT_FALSE(plan.reused);
  reuse.Keep(Save("j", {"a", "b"}), &first);
  auto again = reuse.Find(Save("j", {"a", "b"}), "/ckpt/2.staging");
  ASSERT_TRUE(again.has_value());
  for (const RankPlan& plan : *again) EXPECT_TRUE(plan.reused);
  // The state machine reports it in the operation (and so in its status and the log).
  FakeClock clock;
  JobState jobs(&clock, JobStateOptions());
  absl::StatusOr<const Operation*> op;
  for (int r = 0; r < 2; ++r) {
    JoinRequest join;
    join.job = "j";
    join.world_size = 2;
    join.rank = r;
    join.path = "/ckpt/2";
    join.location.worker_id = "w";
    op = jobs.JoinOperation(join);
    ASSERT_TRUE(op.ok()) << op.status();
  }
  const std::string id = (*op)->id;
  ASSERT_TRUE(jobs.SetPlan(id, *std::move(again)).ok());
  EXPECT_TRUE(jobs.FindOperation(id)->plan_reused);
}

TEST(SavePlanReuseTest, KeepingAndReusingAPlanCopiesNoPartBytes) {
  SavePlanReuse reuse;
  std::vector<RankPlan> first = Plans("/ckpt/1.staging");
  reuse.Keep(Save("j", {"a", "b"}), &first);
  auto again = reuse.Find(Save("j", {"a", "b"}), "/ckpt/2.staging");
  ASSERT_TRUE(again.has_value());
  auto third = reuse.Find(Save("j", {"a", "b"}), "/ckpt/3.staging");
  ASSERT_TRUE(third.has_value());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE((*again)[r].part.SharesBodyWith(first[r].part)) << "rank " << r;
    EXPECT_TRUE((*third)[r].part.SharesBodyWith(first[r].part)) << "rank " << r;
    pb::SavePlanPart part;
    ASSERT_TRUE(part.ParseFromString((*third)[r].part.Bytes()));
    EXPECT_EQ(part.staging_dir(), "/ckpt/3.staging");
  }
}

TEST(SavePlanReuseTest, KeptPartsAreNamedByTheirOperationAndReusedOnesAppendOnlyATail) {
  SavePlanReuse reuse;
  std::vector<RankPlan> first = Plans("/ckpt/1.staging");
  const Operation op = Save("j", {"a", "b"});
  reuse.Keep(op, &first);
  auto again = reuse.Find(Save("j", {"a", "b"}), "/ckpt/2.staging");
  ASSERT_TRUE(again.has_value());
  for (int r = 0; r < 2; ++r) {
    // The first save's parts (which go to the workers) name the body they will keep.
    EXPECT_EQ(first[r].part.body_id(), op.id);
    EXPECT_TRUE(first[r].part.TailBytes().empty());
    EXPECT_EQ((*again)[r].part.body_id(), op.id);
    EXPECT_EQ((*again)[r].part.body_size(), first[r].part.size());
    // The kept body then the tail parse as the reused part: the tail alone can be sent.
    pb::SavePlanPart part;
    ASSERT_TRUE(part.ParseFromString(first[r].part.Bytes() + (*again)[r].part.TailBytes()));
    EXPECT_EQ(part.staging_dir(), "/ckpt/2.staging");
    EXPECT_EQ(part.rank(), r);
  }
}

TEST(SavePlanReuseTest, PartsOfAPlanNotKeptAreNotNamed) {
  SavePlanReuse reuse;
  std::vector<RankPlan> plans = Plans("/s");
  reuse.Keep(Save("j", {"a", ""}), &plans);  // a rank without a digest: nothing kept
  for (const RankPlan& plan : plans) EXPECT_TRUE(plan.part.body_id().empty());
}

TEST(SavePlanReuseTest, AnyChangedOrMissingDigestOrWorldSizeReplans) {
  SavePlanReuse reuse;
  KeepPlans(reuse, Save("j", {"a", "b"}), Plans("/s"));
  EXPECT_FALSE(reuse.Find(Save("j", {"a", "c"}), "/t").has_value());  // a changed rank
  EXPECT_FALSE(reuse.Find(Save("j", {"a", ""}), "/t").has_value());   // no digest sent
  EXPECT_FALSE(reuse.Find(Save("j", {"a", "b", "c"}), "/t").has_value());
  EXPECT_FALSE(reuse.Find(Save("k", {"a", "b"}), "/t").has_value());  // another job
  // A plan built for ranks without digests is not kept (and drops the job's older plan).
  KeepPlans(reuse, Save("j", {"a", ""}), Plans("/s"));
  EXPECT_FALSE(reuse.Find(Save("j", {"a", "b"}), "/t").has_value());
  EXPECT_EQ(reuse.reused(), 0);
}

TEST(SavePlanReuseTest, OtherProcessGroupsReplan) {
  SavePlanReuse reuse;
  Operation grouped = Save("j", {"a", "b"});
  grouped.process_groups = "read-groups:1";
  KeepPlans(reuse, grouped, Plans("/s"));
  EXPECT_FALSE(reuse.Find(Save("j", {"a", "b"}), "/t").has_value());  // one group now
  EXPECT_TRUE(reuse.Find(grouped, "/t").has_value());
  // Per-node groups follow the ranks' hosts: a rank on another host replans.
  Operation per_node = Save("j", {"a", "b"});
  per_node.process_groups = "per-node";
  per_node.ranks[0].location.host = per_node.ranks[1].location.host = "h1";
  KeepPlans(reuse, per_node, Plans("/s"));
  per_node.ranks[1].location.host = "h2";
  EXPECT_FALSE(reuse.Find(per_node, "/t").has_value());
}

TEST(SavePlanReuseTest, TheMemoryBoundDropsTheLeastRecentlyUsedJobsPlan) {
  const std::vector<RankPlan> plans = Plans("/s");
  int64_t one = 0;
  for (const RankPlan& p : plans) one += static_cast<int64_t>(p.part.size()) + 32;
  SavePlanReuse reuse(/*max_bytes=*/2 * one);
  KeepPlans(reuse, Save("a", {"x", "y"}), plans);
  KeepPlans(reuse, Save("b", {"x", "y"}), plans);
  ASSERT_TRUE(reuse.Find(Save("a", {"x", "y"}), "/t").has_value());  // "a" used last
  KeepPlans(reuse, Save("c", {"x", "y"}), plans);                    // drops "b"
  EXPECT_TRUE(reuse.Find(Save("a", {"x", "y"}), "/t").has_value());
  EXPECT_FALSE(reuse.Find(Save("b", {"x", "y"}), "/t").has_value());
  EXPECT_TRUE(reuse.Find(Save("c", {"x", "y"}), "/t").has_value());
}

}  // namespace
}  // namespace ckpt::coordinator
