// Live transfer between jobs end to end (issue 17): real ckpt_coordinator and ckpt_worker
// processes on loopback, a source job (a TP=4 x DP=2 trainer on the workers of "hostA") that
// publishes versions of its state, and a destination job (TP=2 x 3 replicas on the workers of
// "hostB") that receives them through the client library (tests/transfer_probe). The source's
// workers serve the receive as extra ranks of its exchange (serving participants), so every
// byte moves over the data plane from the source workers straight to the destination's.
// - two successive versions arrive bit-exact (every element is its version's value), the
//   second receive reuses the plan of the first, and the published versions are listed;
// - a source worker killed (SIGKILL) mid-transfer fails the receive naming that worker, and the
//   destination's tensors still hold the previous version, whole;
// - an ordinary memory load (mem://) whose files are held only by workers outside its ranks
//   reads them through the same serving participants (it used to be refused);
// - verify mode catches a byte corrupted in flight (a test hook of the serving worker flips
//   one byte of each unit after its checksum was taken), as DataLoss naming the tensor, the
//   version and the source worker; nothing reaches the destination's tensors.
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;
constexpr int kSourceWorkers = 4;  // hostA: workers 0-3, two source ranks each
constexpr int kDestWorkers = 3;    // hostB: workers 4-6, two destination ranks each

// The source (8 ranks, TP=4 x DP=2) and destination (6 ranks, TP=2 x 3) processes.
struct Jobs {
  std::vector<Child*> source, dest;
};

std::vector<std::string> Shape(int tp) {
  return {"--tp", absl::StrCat(tp), "--global_rows", "4", "--elements", "8192"};
}

// The workers run the testonly daemon: its hooks (CKPT_TEST_SERVE_HOLD_DIR,
// CKPT_TEST_CORRUPT_SENT_UNITS, worker/test_hooks_on.cc) stall or corrupt a serving worker.
void StartWorkers(Cluster& cluster) {
  cluster.set_worker_binary("worker/ckpt_worker_testing");
  for (int i = 0; i < kSourceWorkers + kDestWorkers; ++i) {
    cluster.StartWorker(i, {i < kSourceWorkers ? "--host=hostA" : "--host=hostB",
                            "--data_plane_address=127.0.0.1"});
  }
}

// Source ranks r on worker r / 2; destination ranks r on worker 4 + r / 2.
Jobs StartJobs(Cluster& cluster, const std::string& name, const std::string& dir, int versions,
               int receives, const std::vector<std::string>& receive_extra = {}) {
  Jobs jobs;
  for (int r = 0; r < 8; ++r) {
    std::vector<std::string> extra = {"--mode",     "publish",    "--name",
                                      name,         "--versions", absl::StrCat(versions),
                                      "--step_dir", dir};
    for (const std::string& s : Shape(4)) extra.push_back(s);
    jobs.source.push_back(StartTransferProbe(cluster, r / 2, "trainer", r, 8, extra));
  }
  for (int r = 0; r < 6; ++r) {
    std::vector<std::string> extra = {
        "--mode",     "receive", "--name",   name,   "--receives", absl::StrCat(receives),
        "--step_dir", dir,       "--budget", "16384"};
    for (const std::string& s : Shape(2)) extra.push_back(s);
    extra.insert(extra.end(), receive_extra.begin(), receive_extra.end());
    jobs.dest.push_back(StartTransferProbe(cluster, kSourceWorkers + r / 2, "infer", r, 6, extra));
  }
  return jobs;
}

bool AllSaid(const std::vector<Child*>& children, const std::string& line) {
  for (Child* c : children) {
    if (!absl::StrContains(c->Stdout(), line)) return false;
  }
  return true;
}

// The line of `child` starting with `prefix` ("" when none).
std::string LineStarting(const Child& child, const std::string& prefix) {
  for (absl::string_view line : absl::StrSplit(child.Stdout(), '\n')) {
    if (absl::StartsWith(line, prefix)) return std::string(line);
  }
  return "";
}

void Touch(const std::string& path) { WriteFile(path, "go\n"); }

// The communicator_reused=... values of every worker's part of operation `op` (the destination
// ranks' load_part_exchanged and the serving ranks' transfer_served log lines).
std::vector<std::string> CommunicatorReuse(Cluster& cluster, const std::string& op) {
  std::vector<std::string> out;
  for (int i = 0; i < cluster.num_workers(); ++i) {
    for (absl::string_view line : absl::StrSplit(cluster.worker(i).Stderr(), '\n')) {
      if (!absl::StrContains(line, absl::StrCat(" op=", op, " ")) ||
          !(absl::StrContains(line, "load_part_exchanged") ||
            absl::StrContains(line, "transfer_served"))) {
        continue;
      }
      const size_t at = line.find("communicator_reused=");
      out.push_back(at == absl::string_view::npos
                        ? "missing"
                        : std::string(line.substr(at, line.find(' ', at) - at)));
    }
  }
  return out;
}

// The receives (loads of xfer:// paths) of job "infer", oldest first.
std::vector<pb::OperationStatus> Receives(Cluster& cluster) {
  std::vector<pb::OperationStatus> out;
  const pb::GetStatusResponse status = cluster.Status();
  for (const pb::OperationStatus& op : status.operations()) {
    if (op.job() == "infer" && absl::StartsWith(op.path(), "xfer://")) out.push_back(op);
  }
  return out;
}

TEST(TransferTest,
     TwoVersionsFromTp4Dp2IntoTp2ThreeReplicasAreBitExactReusingPlanAndCommunicators) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartWorkers(cluster);
  const std::string dir = FreshDir("steps");
  Jobs jobs = StartJobs(cluster, "policy", dir, 2, 2);
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "durable 1 0 "); }))
      << ClusterLogs(cluster);
  Touch(dir + "/receive.1");
  ASSERT_TRUE(WaitFor([&] { return ReceivesJudged(jobs.dest, 1); })) << ClusterLogs(cluster);
  for (Child* d : jobs.dest) {
    EXPECT_THAT(d->Stdout(), HasSubstr("received 1 0 \n")) << d->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(d->Stdout(), HasSubstr("version policy 1\n")) << d->Stdout();  // as reported
    EXPECT_THAT(d->Stdout(), HasSubstr("holds 1\n")) << d->Stdout();
  }
  Touch(dir + "/publish.2");
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "durable 2 "); })) << ClusterLogs(cluster);
  for (Child* s : jobs.source) EXPECT_THAT(s->Stdout(), HasSubstr("durable 2 0 \n"));
  Touch(dir + "/receive.2");
  ASSERT_TRUE(WaitFor([&] { return ReceivesJudged(jobs.dest, 2); })) << ClusterLogs(cluster);
  for (Child* d : jobs.dest) {
    EXPECT_THAT(d->Stdout(), HasSubstr("received 2 0 \n")) << d->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(d->Stdout(), HasSubstr("version policy 2\n")) << d->Stdout();
    EXPECT_THAT(d->Stdout(), HasSubstr("holds 2\n")) << d->Stdout();
  }
  // Served by the two workers holding the main replica's files (DP rank 0: workers 0 and 1),
  // outside the destination's ranks; planned once, reused for version 2.
  std::vector<pb::OperationStatus> receives = Receives(cluster);
  ASSERT_EQ(receives.size(), 2u);
  EXPECT_EQ(receives[0].transfer_serving_ranks(), 2);
  EXPECT_FALSE(receives[0].transfer_plan_reused());
  EXPECT_EQ(receives[1].transfer_serving_ranks(), 2);
  EXPECT_TRUE(receives[1].transfer_plan_reused());
  EXPECT_EQ(receives[1].phase(), pb::PHASE_DONE);
  EXPECT_EQ(receives[0].received_version(), 1);
  EXPECT_EQ(receives[1].received_version(), 2);
  // Issue 40: the second receive's 8 ranks (6 destination, 2 serving) reuse the first one's
  // communicators: no mesh rendezvous, no TCP connects (counted in the workers' part logs).
  EXPECT_EQ(CommunicatorReuse(cluster, receives[0].id()),
            std::vector<std::string>(8, "communicator_reused=false"))
      << ClusterLogs(cluster);
  EXPECT_EQ(CommunicatorReuse(cluster, receives[1].id()),
            std::vector<std::string>(8, "communicator_reused=true"))
      << ClusterLogs(cluster);
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.published_size(), 1);
  EXPECT_EQ(status.published(0).name(), "policy");
  ASSERT_EQ(status.published(0).versions_size(), 2);
  EXPECT_EQ(status.published(0).versions(1).version(), 2);
  EXPECT_EQ(status.published(0).versions(1).memory_checkpoint(), "policy.v2");
  EXPECT_GT(status.published(0).versions(1).bytes(), 4 * 8192 * 4);
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"transfer", "list", "--coordinator", cluster.address()}, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("xfer://policy@2"));
  EXPECT_THAT(out, HasSubstr(cluster.worker_id(0)));
}

TEST(TransferTest, ASourceWorkerKilledMidTransferLeavesTheDestinationOnThePreviousVersion) {
  const std::string hold_dir = FreshDir("hold");
  setenv("CKPT_TEST_SERVE_HOLD_DIR", hold_dir.c_str(), 1);  // inherited by the workers
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartWorkers(cluster);
  unsetenv("CKPT_TEST_SERVE_HOLD_DIR");
  const std::string dir = FreshDir("steps");
  Jobs jobs = StartJobs(cluster, "policy", dir, 2, 2);
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "durable 1 0 "); }))
      << ClusterLogs(cluster);
  Touch(dir + "/receive.1");
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.dest, "holds 1\n"); })) << ClusterLogs(cluster);
  Touch(dir + "/publish.2");
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "durable 2 0 "); }))
      << ClusterLogs(cluster);
  // The serving workers stall after their first wave of version 2 (some of it has reached the
  // destination by then); the first to say so is killed.
  Touch(hold_dir + "/hold");
  Touch(dir + "/receive.2");
  int victim = -1;
  ASSERT_TRUE(WaitFor([&] {
    for (int i = 0; i < kSourceWorkers; ++i) {
      if (Exists(absl::StrCat(hold_dir, "/held.", cluster.worker(i).pid))) victim = i;
    }
    return victim >= 0;
  })) << ClusterLogs(cluster);
  cluster.worker(victim).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return ReceivesJudged(jobs.dest, 2); })) << ClusterLogs(cluster);
  for (Child* d : jobs.dest) {
    const std::string received = LineStarting(*d, "received 2 ");
    EXPECT_THAT(received, ::testing::Not(HasSubstr("received 2 0 "))) << received;
    EXPECT_THAT(received, HasSubstr(cluster.worker_id(victim))) << received;
    EXPECT_THAT(received, HasSubstr("serving rank")) << received;
    EXPECT_THAT(received, HasSubstr("xfer://policy@2")) << received;
    // Still version 1, whole: nothing of the failed version 2 reached the tensors.
    EXPECT_THAT(d->Stdout(), HasSubstr("received 2 ")) << d->Stdout();
    const std::string out = d->Stdout();
    EXPECT_EQ(out.substr(out.rfind("holds")), "holds 1\n") << out;
  }
}

TEST(TransferTest, VerifyModeCatchesAByteCorruptedInFlightNamingTensorVersionAndWorker) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.set_worker_binary("worker/ckpt_worker_testing");  // has the corruption hook
  setenv("CKPT_TEST_CORRUPT_SENT_UNITS", "1", 1);           // the source workers only
  for (int i = 0; i < kSourceWorkers; ++i) {
    cluster.StartWorker(i, {"--host=hostA", "--data_plane_address=127.0.0.1"});
  }
  unsetenv("CKPT_TEST_CORRUPT_SENT_UNITS");
  for (int i = kSourceWorkers; i < kSourceWorkers + kDestWorkers; ++i) {
    cluster.StartWorker(i, {"--host=hostB", "--data_plane_address=127.0.0.1"});
  }
  const std::string dir = FreshDir("steps");
  Jobs jobs = StartJobs(cluster, "checked", dir, 1, 1, {"--verify", "1"});
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "durable 1 0 "); }))
      << ClusterLogs(cluster);
  Touch(dir + "/receive.1");
  ASSERT_TRUE(WaitFor([&] { return ReceivesJudged(jobs.dest, 1); })) << ClusterLogs(cluster);
  for (Child* d : jobs.dest) {
    const std::string received = LineStarting(*d, "received 1 ");
    EXPECT_THAT(received, HasSubstr(absl::StrCat("received 1 ",
                                                 static_cast<int>(absl::StatusCode::kDataLoss))))
        << received << ClusterLogs(cluster);
    EXPECT_THAT(received, HasSubstr("probe.weight")) << received;
    EXPECT_THAT(received, HasSubstr("xfer://checked@1")) << received;
    EXPECT_THAT(received,
                ::testing::AnyOf(HasSubstr(cluster.worker_id(0)), HasSubstr(cluster.worker_id(1))))
        << received;
    EXPECT_THAT(d->Stdout(), HasSubstr("holds 0\n")) << d->Stdout();
  }
}

TEST(TransferTest, OperatorRequestedPublishAndReceiveRunAtTheJobsNextPoll) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartWorkers(cluster);
  Jobs jobs;
  for (int r = 0; r < 8; ++r) {
    std::vector<std::string> extra = {"--mode", "poll", "--fill_version", "1"};
    for (const std::string& s : Shape(4)) extra.push_back(s);
    jobs.source.push_back(StartTransferProbe(cluster, r / 2, "trainer", r, 8, extra));
  }
  for (int r = 0; r < 6; ++r) {
    std::vector<std::string> extra = {"--mode", "poll"};
    for (const std::string& s : Shape(2)) extra.push_back(s);
    jobs.dest.push_back(StartTransferProbe(cluster, kSourceWorkers + r / 2, "infer", r, 6, extra));
  }
  // Every rank of both jobs is attached before the operator asks.
  ASSERT_TRUE(WaitFor([&] {
    int attached = 0;
    const pb::GetStatusResponse status = cluster.Status();
    for (const pb::JobStatus& j : status.jobs()) attached += j.ranks_size();
    return attached == 14;
  })) << ClusterLogs(cluster);
  std::string out;
  ASSERT_EQ(
      cluster.RunCkptctl(
          {"save", "--coordinator", cluster.address(), "--job", "trainer", "xfer://ops"}, &out),
      0)
      << out << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.source, "polled save 0 "); }))
      << ClusterLogs(cluster);
  ASSERT_EQ(cluster.RunCkptctl(
                {"load", "--coordinator", cluster.address(), "--job", "infer", "xfer://ops"}, &out),
            0)
      << out << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return AllSaid(jobs.dest, "holds "); })) << ClusterLogs(cluster);
  for (Child* d : jobs.dest) {
    EXPECT_THAT(d->Stdout(), HasSubstr("polled load 0 \n")) << d->Stdout();
    EXPECT_THAT(d->Stdout(), HasSubstr("holds 1\n")) << d->Stdout();
  }
  ASSERT_EQ(cluster.RunCkptctl({"transfer", "ops", "--coordinator", cluster.address()}, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("publish xfer://ops"));
  EXPECT_THAT(out, HasSubstr("receive xfer://ops"));
  EXPECT_THAT(out, HasSubstr("+ 2 serving"));
}

TEST(TransferTest, AMemoryLoadReadsFilesHeldOnlyOutsideItsRanksThroughServingParticipants) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) {
    cluster.StartWorker(
        i, {i < 2 ? "--host=hostA" : "--host=hostB", "--data_plane_address=127.0.0.1"});
  }
  auto run = [&](const std::vector<int>& workers, const std::string& job, const std::string& mode,
                 const std::vector<std::string>& extra) {
    std::vector<Child*> ranks;
    for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
      ranks.push_back(cluster.StartTrainer(workers[r], job, r, static_cast<int>(workers.size()),
                                           mode, "mem://outside", extra));
    }
    EXPECT_TRUE(WaitFor([&] {
      for (Child* t : ranks) {
        if (t->Running()) return false;
      }
      return true;
    })) << ClusterLogs(cluster);
    return ranks;
  };
  // Saved on workers 0 and 1 with no replicas: nothing of it is on workers 2 and 3.
  for (Child* t : run({0, 1}, "train", "save", {"--elements", "4096", "--replicas", "0"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  for (Child* t : run({2, 3}, "serve", "load", {"--elements", "4096", "--layout", "cols"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
  }
  bool served = false;
  const pb::GetStatusResponse status = cluster.Status();
  for (const pb::OperationStatus& op : status.operations()) {
    if (op.job() == "serve")
      served = op.transfer_serving_ranks() == 2 && op.phase() == pb::PHASE_DONE;
  }
  EXPECT_TRUE(served) << ClusterLogs(cluster);
}

}  // namespace
TEST(TransferTest, PublishingManyVersionsKeepsTheNewestKPerNameAndNeverEvictsAMemoryCheckpoint) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs), "--memory_replicas=0",
                                "--memory_keep=1", "--transfer_keep_versions=2"}));
  cluster.StartWorker(0, {"--memory_tier_keep=1"});
  const std::vector<std::string> row = {"--global_rows", "1", "--elements", "4096"};
  for (Child* t : RunRanksOn(cluster, {0}, "train", "save", "mem://ckpt", row)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  // Three versions of "policy" from the same worker (the step files exist: no waiting).
  const std::string dir = FreshDir("steps");
  Touch(dir + "/publish.2");
  Touch(dir + "/publish.3");
  Child* source =
      StartTransferProbe(cluster, 0, "trainer", 0, 1,
                         {"--mode", "publish", "--name", "policy", "--versions", "3", "--step_dir",
                          dir, "--tp", "1", "--global_rows", "1", "--elements", "4096"});
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(source->Stdout(), "durable 3 "); }))
      << source->Stdout() << ClusterLogs(cluster);
  EXPECT_THAT(source->Stdout(), HasSubstr("durable 3 0 "));
  // The catalog keeps the newest two versions and the memory checkpoint.
  std::vector<std::string> names;
  const pb::GetStatusResponse status = cluster.Status();
  for (const pb::MemoryCheckpointStatus& m : status.memory_checkpoints()) {
    names.push_back(m.name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt", "policy.v2", "policy.v3"}));
  // The worker evicted only policy.v1 (its name's oldest): the memory checkpoint still loads.
  for (Child* t : RunRanksOn(cluster, {0}, "serve", "load", "mem://ckpt", row)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
  }
  EXPECT_THAT(cluster.worker(0).Stderr(), ::testing::Not(HasSubstr("evicted=mem://ckpt")));
}

}  // namespace ckpt::testing
