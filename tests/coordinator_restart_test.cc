// Multi-process tests of a coordinator that restarts (SIGKILL, a new process on the same
// address and state directory): ids of the new process never collide with the old one's,
// workers notice at their first refused call and register again at once, the next operation
// works, and the staging directory of a save the crash cut short is removed at start-up. And
// of one that stalls while workers report: their results are sent until acknowledged.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_util.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

// Names in the cluster's directory that start with `prefix` (staging directories of a path).
std::vector<std::string> EntriesStartingWith(Cluster& cluster, const std::string& prefix) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> names = ListDir(cluster.dir());
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  return out;
}

// Whether every started worker is registered, alive, with the coordinator's current
// incarnation in its id and its own pid, and every rank of `job` is attached again.
bool AllReRegistered(Cluster& cluster, const std::string& job, int ranks) {
  pb::GetStatusResponse s = cluster.Status();
  const std::string incarnation = absl::StrFormat("%016x", s.incarnation());
  std::set<int> pids;
  for (const pb::WorkerStatus& w : s.workers()) {
    if (!w.alive() || w.worker_id().find(incarnation) == std::string::npos) return false;
    pids.insert(w.info().pid());
  }
  for (int i = 0; i < cluster.num_workers(); ++i) {
    if (pids.count(cluster.worker(i).pid) == 0) return false;
  }
  for (const pb::JobStatus& j : s.jobs()) {
    if (j.name() == job) return j.ranks_size() == ranks;
  }
  return false;
}

// The issue: after a restart ids started again at 1, the workers dropped the new op-1 as a
// duplicate of the old one (the load hung until its deadline), a worker heartbeated under an
// id the new process had given another, and re-registering took 8-60 s. The lease here is
// long (30 s, heartbeats every 10 s), so only the first refused call can explain a prompt
// re-registration.
TEST(CoordinatorRestartTest, NewIdsPromptReRegistrationAndTheNextLoadWorks) {
  Cluster cluster;
  const std::string lease = "--lease_ms=30000";
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({lease}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/saved";
  for (Child* t : RunRanks(cluster, "job", 2, "save", path, {"--layout", "dtensor"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  const pb::GetStatusResponse before = cluster.Status();
  ASSERT_EQ(before.operations_size(), 1);
  std::vector<Child*> trainers = {
      cluster.StartTrainer(0, "job", 0, 2, "poll", "", {"--layout", "dtensor"}),
      cluster.StartTrainer(1, "job", 1, 2, "poll", "", {"--layout", "dtensor"})};
  ASSERT_TRUE(WaitFor([&] { return Shared(*trainers[0]) && Shared(*trainers[1]); }));
  ASSERT_TRUE(WaitFor([&] { return AllReRegistered(cluster, "job", 2); }));

  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({lease}));
  const absl::Time restarted = absl::Now();  // the new process serves from here on
  ASSERT_TRUE(WaitFor([&] { return AllReRegistered(cluster, "job", 2); })) << ClusterLogs(cluster);
  const absl::Duration took = absl::Now() - restarted;
  std::printf("workers registered again and re-attached their ranks %s after the restart\n",
              absl::FormatDuration(took).c_str());
  // Far below the 10 s heartbeat period: the broken work stream told the workers.
  EXPECT_LT(took, absl::Seconds(5)) << ClusterLogs(cluster);
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT(cluster.worker(w).Stderr(), HasSubstr("reregistered_after_ms="));
  }

  const pb::GetStatusResponse after = cluster.Status();
  EXPECT_NE(after.incarnation(), before.incarnation());
  for (const pb::WorkerStatus& fresh : after.workers()) {
    for (const pb::WorkerStatus& old : before.workers()) {
      EXPECT_NE(fresh.worker_id(), old.worker_id());
    }
  }
  // The next operation: an operator's load, taken by both trainers at their next Poll.
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "job",
                                "--timeout", "60s", path},
                               &out),
            0)
      << out << ClusterLogs(cluster);
  for (Child* t : trainers) {
    ASSERT_TRUE(WaitFor([&] { return Result(*t).first >= 0; }));
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  const pb::GetStatusResponse loaded = cluster.Status();
  ASSERT_EQ(loaded.operations_size(), 1);
  EXPECT_NE(loaded.operations(0).id(), before.operations(0).id());
  EXPECT_EQ(loaded.operations(0).phase(), pb::PHASE_DONE);
}

// A coordinator killed while a save writes: its staging directory (hundreds of MB) stayed
// forever. The next coordinator on the same state directory removes it at start-up and says
// so with its size; the trainers hear that the operation is gone, and the next save commits.
TEST(CoordinatorRestartTest, ACrashMidSaveLeavesNoStagingAndTheNextSaveCommits) {
  Cluster cluster;
  const std::string lease = "--lease_ms=600";
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({lease}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/big";
  const std::vector<std::string> big = {"--elements", "50000000"};  // 200 MB per rank
  std::vector<Child*> savers = {cluster.StartTrainer(0, "big", 0, 2, "save", path, big),
                                cluster.StartTrainer(1, "big", 1, 2, "save", path, big)};
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() == 1 && s.operations(0).phase() == pb::PHASE_EXECUTING;
  })) << ClusterLogs(cluster);
  const std::vector<std::string> staging = EntriesStartingWith(cluster, ".big.tmp-");
  ASSERT_EQ(staging.size(), 1u);

  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({lease}));
  EXPECT_THAT(
      cluster.coordinator().Stderr(),
      HasSubstr(absl::StrCat("staging_removed path=", cluster.dir(), "/", staging[0], " bytes=")))
      << ClusterLogs(cluster);
  EXPECT_TRUE(EntriesStartingWith(cluster, ".big.").empty()) << ClusterLogs(cluster);
  // The trainers hear that the save is gone: "unknown to this coordinator (incarnation ...)",
  // or, for a call that was in flight at the coordinator when it died, that call's failure.
  for (Child* t : savers) {
    // Exited, not only printed its result: its Goodbye must reach the worker before the next
    // save's trainer of the same rank says Hello.
    ASSERT_TRUE(WaitFor([&] { return Result(*t).first >= 0 && !t->Running(); }))
        << ClusterLogs(cluster);
    EXPECT_NE(Result(*t).first, 0);
    EXPECT_THAT(Result(*t).second, HasSubstr("coordinator")) << Result(*t).second;
  }
  EXPECT_FALSE(PathExists(path));

  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 2; })) << ClusterLogs(cluster);
  for (Child* t : RunRanks(cluster, "big", 2, "save", path, {})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
  EXPECT_TRUE(EntriesStartingWith(cluster, ".big.").empty());
}

// Connections waiting in the accept queue of the listening unix socket `path` (ss's Recv-Q of a
// listening socket); -1 when ss cannot tell.
int PendingConnections(const std::string& path) {
  FILE* ss = popen(("ss -xlH src " + path + " 2>/dev/null").c_str(), "r");
  if (ss == nullptr) return -1;
  char line[512];
  int pending = -1;
  if (std::fgets(line, sizeof(line), ss) != nullptr) {
    char netid[16], state[16];
    if (std::sscanf(line, "%15s %15s %d", netid, state, &pending) != 3) pending = -1;
  }
  pclose(ss);
  return pending;
}

// A trainer says Hello to its worker after the coordinator restarted but before the worker
// noticed (the worker is frozen with SIGSTOP across the restart and thawed once the trainer's
// connection waits in its accept queue). Before, the worker attached the rank under its old
// id, the new coordinator refused it ("not registered"), and the trainer failed; now the worker
// asks the coordinator, registers again and attaches under its new id, and the save commits.
TEST(CoordinatorRestartTest, ATrainerArrivingBeforeItsWorkerNoticedARestartIsAttached) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=3000"}));
  cluster.StartWorker(0);
  for (Child* t : RunRanks(cluster, "early", 1, "save", cluster.dir() + "/first", {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  kill(cluster.worker(0).pid, SIGSTOP);  // Child::Kill would wait for it to exit
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({"--lease_ms=3000"}));
  const std::string path = cluster.dir() + "/late";
  Child* late = cluster.StartTrainer(0, "late", 0, 1, "save", path, {});
  const bool queued =
      WaitFor([&] { return PendingConnections(cluster.worker_socket(0)) > 0; }, absl::Seconds(30));
  kill(cluster.worker(0).pid, SIGCONT);
  ASSERT_TRUE(queued) << "the trainer never connected to the frozen worker";
  ASSERT_TRUE(WaitFor([&] { return Result(*late).first >= 0; })) << ClusterLogs(cluster);
  EXPECT_EQ(Result(*late).first, 0) << Result(*late).second << ClusterLogs(cluster);
  EXPECT_TRUE(PathExists(path));
  std::printf("the worker %s\n",
              absl::StrContains(cluster.worker(0).Stderr(), "trainer_hello_registers_again")
                  ? "registered again while attaching the trainer"
                  : "had registered again before the trainer's Hello");
}

// A coordinator that stalls (SIGSTOP, shorter than the lease) while the workers finish their
// parts: their ReportResult calls time out. Before, a failed report was only logged and the
// operation waited out its execution deadline; now each result is sent again until the
// coordinator acknowledges it, and the save commits once it is back.
TEST(CoordinatorOutageTest, ResultsReportedWhileTheCoordinatorStallsAreSentUntilAcknowledged) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.StartCoordinator({"--lease_ms=20000", "--execution_deadline_ms=40000"}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/stalled";
  const std::vector<std::string> size = {"--elements", "25000000"};  // 100 MB per rank
  std::vector<Child*> savers = {cluster.StartTrainer(0, "s", 0, 2, "save", path, size),
                                cluster.StartTrainer(1, "s", 1, 2, "save", path, size)};
  // Executing, and both joins answered: the last rank's JoinOperation response leaves the
  // coordinator after the operation entered executing, and a stall before it arrives would fail
  // the join rather than the reports this test is about.
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() == 1 && s.operations(0).phase() == pb::PHASE_EXECUTING &&
           cluster.worker(0).Stderr().find("operation_joined op=") != std::string::npos &&
           cluster.worker(1).Stderr().find("operation_joined op=") != std::string::npos;
  })) << ClusterLogs(cluster);
  kill(cluster.coordinator().pid, SIGSTOP);
  // Both workers finish writing and fail to report (their 5 s call deadline passes).
  auto report_failed = [&](int w) {
    const std::string log = cluster.worker(w).Stderr();
    return log.find("report_failed op=") != std::string::npos ||
           log.find("reported=false") != std::string::npos;
  };
  const bool both_failed = WaitFor([&] { return report_failed(0) && report_failed(1); });
  kill(cluster.coordinator().pid, SIGCONT);
  ASSERT_TRUE(both_failed) << ClusterLogs(cluster);
  for (Child* t : savers) {
    ASSERT_TRUE(WaitFor([&] { return Result(*t).first >= 0; })) << ClusterLogs(cluster);
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << "\n" << ClusterLogs(cluster);
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT(cluster.worker(w).Stderr(), HasSubstr("reported=true attempts="))
        << ClusterLogs(cluster);
  }
}

}  // namespace
}  // namespace ckpt::testing
