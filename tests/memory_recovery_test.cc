// Recovery of the in-memory tier after a coordinator restart (issue 17), end to end: real
// ckpt_coordinator and ckpt_worker processes on loopback (workers announcing two hosts) and
// trainer processes using the client library. The coordinator is killed with SIGKILL and
// started again on the same address; every worker reports what its memory tier holds when it
// registers with the new process (with the coordinator's record of each commit, which it kept),
// and the new process rebuilds its memory catalog and published versions from those reports:
// - a replicated memory checkpoint saved before the restart is listed again with its replicas
//   and loads into two other layouts, bit-exact;
// - a version published before the restart is received by a job started after it, bit-exact;
// - a memory checkpoint whose only holder did not come back is refused, naming the file and
//   tensor and saying why.
// Events are ordered by the workers' logs (each says when it kept the record of a commit) and
// the coordinator's status, never by timing.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

// Long enough that a busy machine does not cost a worker its lease mid-save (the restart is
// noticed through the broken work stream, not the lease).
constexpr int kLeaseMs = 2000;
const std::vector<std::string> kRows = {"--global_rows", "4", "--elements", "4096"};

// Workers 0..n-1: the first half on hostA, the rest on hostB.
void StartTwoHosts(Cluster& cluster, int n) {
  for (int i = 0; i < n; ++i) {
    cluster.StartWorker(
        i, {i < n / 2 ? "--host=hostA" : "--host=hostB", "--data_plane_address=127.0.0.1"});
  }
}

// Whether worker `i` logged that it kept the coordinator's record of memory checkpoint `name`.
bool KeptRecord(Cluster& cluster, int i, const std::string& name) {
  return absl::StrContains(cluster.worker(i).Stderr(),
                           absl::StrCat("memory_record checkpoint=mem://", name, " kept=true"));
}

// The replicas the catalog lists for `name` (-1 when it is not listed).
int Replicas(Cluster& cluster, const std::string& name) {
  const pb::GetStatusResponse s = cluster.Status();
  for (const pb::MemoryCheckpointStatus& m : s.memory_checkpoints()) {
    if (m.name() == name) return m.replicas_size();
  }
  return -1;
}

void RestartAndWaitForWorkers(Cluster& cluster, int workers) {
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == workers; }))
      << ClusterLogs(cluster);
}

TEST(MemoryRecoveryTest, AMemoryCheckpointLoadsIntoOtherLayoutsAfterTheCoordinatorWasKilled) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartTwoHosts(cluster, 4);
  for (Child* t : RunRanksOn(cluster, {0, 1, 2, 3}, "train", "save", "mem://step1", kRows)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  ASSERT_EQ(Replicas(cluster, "step1"), 8);
  ASSERT_TRUE(WaitFor([&] {
    for (int i = 0; i < 4; ++i) {
      if (!KeptRecord(cluster, i, "step1")) return false;
    }
    return true;
  })) << ClusterLogs(cluster);

  const absl::Time killed = absl::Now();
  ASSERT_NO_FATAL_FAILURE(RestartAndWaitForWorkers(cluster, 4));
  // Every worker reported its copies when it registered: the catalog is whole again.
  ASSERT_TRUE(WaitFor([&] { return Replicas(cluster, "step1") == 8; })) << ClusterLogs(cluster);
  std::printf("catalog whole again %s after the kill (restart included)\n",
              absl::FormatDuration(absl::Now() - killed).c_str());
  EXPECT_THAT(cluster.coordinator().Stderr(), HasSubstr("memory_copy_adopted checkpoint=mem://"));
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("mem://step1"));

  std::vector<std::string> cols = kRows;
  cols.insert(cols.end(), {"--layout", "cols"});
  for (Child* t : RunRanksOn(cluster, {0, 2, 3}, "serve", "load", "mem://step1", cols)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
    EXPECT_THAT(t->Stdout(), ::testing::Not(HasSubstr("mismatch"))) << t->Stdout();
  }
  std::vector<std::string> dtensor = kRows;
  dtensor.insert(dtensor.end(), {"--layout", "dtensor"});
  for (Child* t : RunRanksOn(cluster, {3, 1}, "serve2", "load", "mem://step1", dtensor)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
  }
}

TEST(MemoryRecoveryTest, AFileWhoseOnlyHolderDidNotComeBackIsRefusedNamingIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartTwoHosts(cluster, 2);
  const std::vector<std::string> pair_rows = {"--global_rows", "2", "--elements", "4096"};
  std::vector<std::string> alone = pair_rows;
  alone.insert(alone.end(), {"--replicas", "0"});
  for (Child* t : RunRanksOn(cluster, {0, 1}, "train", "save", "mem://alone", alone)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  ASSERT_TRUE(WaitFor([&] {
    return KeptRecord(cluster, 0, "alone") && KeptRecord(cluster, 1, "alone");
  })) << ClusterLogs(cluster);
  // Worker 1 dies with the coordinator: only worker 0 reports its file.
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(RestartAndWaitForWorkers(cluster, 1));
  ASSERT_TRUE(WaitFor([&] { return Replicas(cluster, "alone") == 1; })) << ClusterLogs(cluster);
  std::vector<Child*> refused =
      RunRanksOn(cluster, {0, 0}, "serve", "load", "mem://alone", pair_rows);
  auto [code, message] = Result(*refused[0]);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << message << refused[0]->Stdout() << ClusterLogs(cluster);
  EXPECT_THAT(message, HasSubstr("mem://alone"));
  EXPECT_THAT(message, HasSubstr("data/r1_"));
  EXPECT_THAT(message, HasSubstr("probe.weight"));
  EXPECT_THAT(message, HasSubstr("no copy left"));
  EXPECT_THAT(message, HasSubstr("restarted coordinator"));
}

TEST(MemoryRecoveryTest, AVersionPublishedBeforeTheCoordinatorWasKilledIsReceivedAfterIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartTwoHosts(cluster, 3);  // worker 0 on hostA serves the source; 1 and 2 the destination
  const std::string dir = FreshDir("steps");
  const std::vector<std::string> shape = {"--global_rows", "4", "--elements", "8192"};
  std::vector<std::string> publish = {"--mode", "publish",    "--name", "policy", "--versions",
                                      "1",      "--step_dir", dir,      "--tp",   "1"};
  publish.insert(publish.end(), shape.begin(), shape.end());
  Child* source = StartTransferProbe(cluster, 0, "trainer", 0, 1, publish);
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(source->Stdout(), "durable 1 0 "); }))
      << source->Stdout() << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return KeptRecord(cluster, 0, "policy.v1"); })) << ClusterLogs(cluster);

  ASSERT_NO_FATAL_FAILURE(RestartAndWaitForWorkers(cluster, 3));
  ASSERT_TRUE(WaitFor([&] {
    const pb::GetStatusResponse s = cluster.Status();
    return s.published_size() == 1 && s.published(0).versions_size() == 1;
  })) << ClusterLogs(cluster);
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"transfer", "list", "--coordinator", cluster.address()}, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("xfer://policy@1"));

  std::vector<Child*> dest;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> receive = {"--mode", "receive",    "--name", "policy", "--receives",
                                        "1",      "--step_dir", dir,      "--tp",   "2"};
    receive.insert(receive.end(), shape.begin(), shape.end());
    dest.push_back(StartTransferProbe(cluster, 1 + r, "infer", r, 2, receive));
  }
  WriteFile(dir + "/receive.1", "go\n");
  for (Child* d : dest) {
    ASSERT_TRUE(WaitFor([&] { return absl::StrContains(d->Stdout(), "holds "); }))
        << d->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(d->Stdout(), HasSubstr("received 1 0 \n")) << d->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(d->Stdout(), HasSubstr("holds 1\n")) << d->Stdout();
  }
}

}  // namespace
}  // namespace ckpt::testing
