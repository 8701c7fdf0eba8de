// Process groups through real daemons (issue 16): a coordinator and four workers on loopback,
// trainers saving and loading through the client library with SaveOptions/LoadOptions
// process_groups. A TP=2 x DP=2 save distributed within data-parallel groups is loaded
// bit-exactly into other layouts with groups whose members hold no main replica (cross-group
// pieces, which such a group reads from storage itself); the workers' logs show one
// communicator per group, never one over the job; bad groups are refused naming the rank and
// group, and nothing is written; an operator's `ckptctl load --process-groups` runs within them.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;
constexpr int64_t kRows = 8;
constexpr int64_t kElements = 5000;                      // per row
constexpr int64_t kTensorBytes = kRows * kElements * 4;  // int32

std::vector<std::string> Shape(std::vector<std::string> args) {
  for (const std::string& a : {std::string("--global_rows"), absl::StrCat(kRows),
                               std::string("--elements"), absl::StrCat(kElements)}) {
    args.push_back(a);
  }
  return args;
}

// The finished operation of `job` of `kind` in the coordinator's status (empty id if none).
pb::OperationStatus FinishedOperation(Cluster& cluster, const std::string& job,
                                      pb::OperationKind kind) {
  pb::GetStatusResponse s = cluster.Status();
  for (const pb::OperationStatus& op : s.operations()) {
    if (op.job() == job && op.kind() == kind && op.phase() == pb::PHASE_DONE) return op;
  }
  return pb::OperationStatus();
}

// Loads `path` as four ranks of `job` with `args`, expecting every element verified.
void LoadAndVerify(Cluster& cluster, const std::string& job, const std::string& path,
                   const std::vector<std::string>& args) {
  for (Child* t : RunRanks(cluster, job, 4, "load", path, Shape(args))) {
    EXPECT_EQ(Result(*t).first, 0) << job << ": " << Result(*t).second;
    EXPECT_THAT(t->Stdout(), HasSubstr("verified ")) << job << ": " << t->Stdout();
  }
}

// Worker w's log line for the exchange of `op` by rank `rank` names group `group` of size 2
// with the rank at `group_rank`.
void ExpectCommunicator(Cluster& cluster, const std::string& op, int rank, int group,
                        int group_rank) {
  EXPECT_THAT(
      cluster.worker(rank).Stderr(),
      HasSubstr(absl::StrCat("load_part_exchanged op=", op, " rank=", rank, " group=\"load/", op,
                             "/g", group, "\" group_rank=", group_rank, " group_world=2 ")))
      << ClusterLogs(cluster);
}

TEST(ProcessGroupsTest, GroupedSaveThenCrossGroupLoadsAreBitExactWithOneCommunicatorPerGroup) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/tp2dp2";
  // Ranks r = dp * 2 + tp; data-parallel groups {0, 2} and {1, 3} each hold one TP shard.
  for (Child* t :
       RunRanks(cluster, "saver", 4, "save", path,
                Shape({"--layout", "tpdp", "--tp", "2", "--groups", "data-parallel:2"}))) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  EXPECT_EQ(FinishedOperation(cluster, "saver", pb::OPERATION_SAVE).process_groups(),
            "data-parallel:2");

  // Every rank replicates the whole tensor (rank 0 the main replica); read groups of 2: group
  // {2, 3} holds no main replica, so all its pieces are cross-group and it reads them itself.
  LoadAndVerify(cluster, "replicated", path,
                {"--layout", "tpdp", "--tp", "1", "--groups", "read-groups:2"});
  const pb::OperationStatus replicated =
      FinishedOperation(cluster, "replicated", pb::OPERATION_LOAD);
  ASSERT_FALSE(replicated.id().empty());
  EXPECT_EQ(replicated.bytes_read(), 2 * kTensorBytes);  // once per group, not once per rank
  for (int rank = 0; rank < 4; ++rank) {
    ExpectCommunicator(cluster, replicated.id(), rank, rank / 2, rank % 2);
  }

  // Into TP=4 (two rows per rank) with explicit groups {0, 3} and {1, 2}: bit-exact.
  LoadAndVerify(cluster, "tp4", path, {"--layout", "dtensor", "--groups", "0,3;1,2"});
  const pb::OperationStatus tp4 = FinishedOperation(cluster, "tp4", pb::OPERATION_LOAD);
  ASSERT_FALSE(tp4.id().empty());
  ExpectCommunicator(cluster, tp4.id(), 0, 0, 0);
  ExpectCommunicator(cluster, tp4.id(), 3, 0, 1);
  ExpectCommunicator(cluster, tp4.id(), 1, 1, 0);
  ExpectCommunicator(cluster, tp4.id(), 2, 1, 1);
  // No exchange of these loads ran over one communicator of the whole job.
  for (int w = 0; w < 4; ++w) {
    EXPECT_THAT(cluster.worker(w).Stderr(), ::testing::Not(HasSubstr("group_world=4")));
  }
}

TEST(ProcessGroupsTest, GroupsThatDoNotPartitionTheRanksAreRefusedNamingRankAndGroup) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/refused";
  for (Child* t : RunRanks(cluster, "bad", 4, "save", path,
                           Shape({"--layout", "dtensor", "--groups", "0,1;2,9"}))) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(Result(*t).second, HasSubstr("process group 1 names rank 9"));
  }
  for (Child* t : RunRanks(cluster, "uneven", 4, "save", path,
                           Shape({"--layout", "dtensor", "--groups", "read-groups:3"}))) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(Result(*t).second, HasSubstr("does not divide the job's 4 ranks"));
  }
  EXPECT_FALSE(Exists(path));
}

// An operator's load with --process-groups: a bad spec is refused naming the group before any
// operation exists; a good one runs at the trainers' next Poll within the groups (each of the
// two read groups reads the replicated tensor from storage once).
TEST(ProcessGroupsTest, CkptctlLoadWithProcessGroupsRunsWithinThemAndRefusesBadOnes) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/replicated";
  const std::vector<std::string> replicated = Shape({"--layout", "tpdp", "--tp", "1"});
  for (Child* t : RunRanks(cluster, "job", 4, "save", path, replicated)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  std::vector<Child*> trainers;
  for (int r = 0; r < 4; ++r) {
    trainers.push_back(cluster.StartTrainer(r, "job", r, 4, "poll", "", replicated));
  }
  ASSERT_TRUE(WaitFor([&] {
    for (Child* t : trainers) {
      if (!Shared(*t)) return false;
    }
    return true;
  }));
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "job",
                                "--process-groups", "0,1;2,9", path},
                               &out),
            1);
  EXPECT_THAT(out, HasSubstr("job job: process group 1 names rank 9"));
  ASSERT_EQ(
      cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "job", "--algorithm",
                          "broadcast", "--process-groups", "read-groups:2", path},
                         &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(2 * kTensorBytes, " bytes read from storage")));
  for (Child* t : trainers) {
    ASSERT_TRUE(WaitFor([&] { return Result(*t).first >= 0; }));
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  EXPECT_EQ(FinishedOperation(cluster, "job", pb::OPERATION_LOAD).process_groups(),
            "read-groups:2");
}

}  // namespace
}  // namespace ckpt::testing
