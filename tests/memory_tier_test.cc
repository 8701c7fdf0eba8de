// The in-memory checkpoint tier end to end (issue 17): real ckpt_coordinator and ckpt_worker
// processes on loopback, workers announcing two hosts (--host), trainer processes saving to
// and loading from mem://<name> through the client library.
// - a memory save keeps every rank's file on its worker and one replica on the other host
//   (the coordinator's catalog, `ckptctl status`), a worker killed with SIGKILL loses its copies,
//   and a load into another layout on other workers is bit-exact from the surviving copies;
// - with both copies of a file lost, a load is refused naming the file, its tensor and the
//   lost workers and hosts;
// - a save that does not fit a worker's memory budget fails naming the worker and the bytes,
//   and commits nothing;
// - hostile names, unknown checkpoints and replicas with no other host are refused.
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;

// Replicas (copies of data files) the catalog lists for `name`; -1 when it is not listed.
int Replicas(Cluster& cluster, const std::string& name) {
  pb::GetStatusResponse s = cluster.Status();
  for (const pb::MemoryCheckpointStatus& m : s.memory_checkpoints()) {
    if (m.name() == name) return m.replicas_size();
  }
  return -1;
}

// Starts 4 workers: 0 and 1 announce hostA, 2 and 3 hostB (all on loopback).
void StartTwoHosts(Cluster& cluster, const std::vector<std::string>& extra = {}) {
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> flags = {i < 2 ? "--host=hostA" : "--host=hostB",
                                      "--data_plane_address=127.0.0.1"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    cluster.StartWorker(i, flags);
  }
}

// Runs one trainer per entry of `workers` (rank r on workers[r]) and waits for all results.
std::vector<Child*> RunOn(Cluster& cluster, const std::vector<int>& workers, const std::string& job,
                          const std::string& mode, const std::string& path,
                          const std::vector<std::string>& extra) {
  return RunRanksOn(cluster, workers, job, mode, path, extra);
}

TEST(MemoryTierTest, SaveReplicatesAcrossHostsAndLoadsFromSurvivorsIntoAnotherLayout) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartTwoHosts(cluster);
  const std::vector<std::string> shape = {"--global_rows", "4", "--elements", "4096"};
  for (Child* t : RunOn(cluster, {0, 1, 2, 3}, "train", "save", "mem://step1", shape)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  // Every rank's file is held by its worker and by one worker of the other host.
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.memory_checkpoints_size(), 1);
  const pb::MemoryCheckpointStatus& m = status.memory_checkpoints(0);
  EXPECT_EQ(m.name(), "step1");
  EXPECT_EQ(m.files(), 4);
  ASSERT_EQ(m.replicas_size(), 8);
  std::map<std::string, std::set<std::string>> hosts_of_file;
  for (const pb::MemoryReplicaStatus& r : m.replicas()) hosts_of_file[r.file()].insert(r.host());
  for (const auto& [file, hosts] : hosts_of_file) {
    EXPECT_EQ(hosts, (std::set<std::string>{"hostA", "hostB"})) << file;
  }
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("mem://step1"));
  EXPECT_THAT(out, HasSubstr(cluster.worker_id(2)));

  // Worker 1 (hostA) dies: the catalog drops its copies once its lease is gone.
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Replicas(cluster, "step1") == 6; })) << ClusterLogs(cluster);
  // Three ranks, column blocks, on workers 0, 2 and 3: every element arrives bit-exact.
  const std::vector<std::string> cols = {"--global_rows", "4",        "--elements",
                                         "4096",          "--layout", "cols"};
  for (Child* t : RunOn(cluster, {0, 2, 3}, "serve", "load", "mem://step1", cols)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stdout() << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
    EXPECT_THAT(t->Stdout(), ::testing::Not(HasSubstr("mismatch"))) << t->Stdout();
  }
  // Two ranks with whole rows on one worker per host as well.
  for (Child* t : RunOn(cluster, {3, 0}, "serve2", "load", "mem://step1",
                        {"--global_rows", "4", "--elements", "4096", "--layout", "dtensor"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
  }

  // Worker 3 (hostB) dies too: its own file and worker 1's copy held there are gone with the
  // two workers that held them, so a load is refused naming the files, tensor, workers, hosts.
  cluster.worker(3).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Replicas(cluster, "step1") == 4; })) << ClusterLogs(cluster);
  std::vector<Child*> refused = RunOn(cluster, {0, 2}, "serve3", "load", "mem://step1",
                                      {"--global_rows", "4", "--elements", "4096"});
  for (Child* t : refused) {
    auto [code, message] = Result(*t);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kFailedPrecondition)) << message;
    EXPECT_THAT(message, HasSubstr("mem://step1"));
    EXPECT_THAT(message, HasSubstr("no copy left"));
    EXPECT_THAT(message, HasSubstr("probe.weight"));
    EXPECT_THAT(message, HasSubstr(cluster.worker_id(1)));
    EXPECT_THAT(message, HasSubstr(cluster.worker_id(3)));
    EXPECT_THAT(message, HasSubstr("hostA"));
    EXPECT_THAT(message, HasSubstr("hostB"));
  }
}

TEST(MemoryTierTest, TwoReplicasSurviveALostWorkerOnEachHost) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  StartTwoHosts(cluster);
  const std::vector<std::string> rows = {"--global_rows", "4",          "--elements",
                                         "4096",          "--replicas", "2"};
  for (Child* t : RunOn(cluster, {0, 1, 2, 3}, "train", "save", "mem://two", rows)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  // Each rank's file: its worker and both workers of the other host.
  ASSERT_EQ(Replicas(cluster, "two"), 12) << ClusterLogs(cluster);
  cluster.worker(0).Kill(SIGKILL);
  cluster.worker(2).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Replicas(cluster, "two") == 6; })) << ClusterLogs(cluster);
  for (Child* t : RunOn(cluster, {1, 3}, "serve", "load", "mem://two",
                        {"--global_rows", "4", "--elements", "4096", "--layout", "cols"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout();
  }
}

TEST(MemoryTierTest, AnOperatorRequestedMemorySaveTakesItsReplicasFromCkptctl) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);  // one host: the default of one replica elsewhere cannot be placed
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  std::string out;
  const std::vector<std::string> save = {
      "save", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "60s"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = save;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  // Refused before anything is asked of the trainers.
  EXPECT_EQ(cluster.RunCkptctl(with({"--replicas", "-1", "mem://neg"}), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("--replicas must be a count >= 0, got '-1'"));
  EXPECT_EQ(cluster.RunCkptctl(with({"--replicas", "0", cluster.dir() + "/on-disk"}), &out), 1)
      << out;
  EXPECT_THAT(out, HasSubstr("memory_replicas 0 is for memory saves"));
  ASSERT_EQ(cluster.RunCkptctl(with({"--replicas", "0", "mem://alone"}), &out), 0)
      << out << ClusterLogs(cluster);
  EXPECT_EQ(Replicas(cluster, "alone"), 1);  // the writer's own copy only
}

TEST(MemoryTierTest, ASaveOverTheMemoryBudgetFailsNamingWorkerAndBytes) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  // Each rank's file is 16 KiB + header; the budget holds one file, not its replica too.
  StartTwoHosts(cluster, {"--memory_tier_bytes=20000"});
  const std::vector<std::string> shape = {"--global_rows", "4", "--elements", "4096"};
  for (Child* t : RunOn(cluster, {0, 1, 2, 3}, "train", "save", "mem://big", shape)) {
    auto [code, message] = Result(*t);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kResourceExhausted)) << message;
    EXPECT_THAT(message, HasSubstr("memory tier cannot keep"));
    EXPECT_THAT(message, HasSubstr("bytes"));
    EXPECT_THAT(message, HasSubstr("20000 byte budget"));
    EXPECT_THAT(message, HasSubstr("worker on host host"));
  }
  EXPECT_EQ(Replicas(cluster, "big"), -1);  // nothing committed
  // A smaller state fits: the name is free again and the save commits.
  for (Child* t : RunOn(cluster, {0, 1, 2, 3}, "train", "save", "mem://big",
                        {"--global_rows", "4", "--elements", "1024"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  EXPECT_EQ(Replicas(cluster, "big"), 8);
}

TEST(MemoryTierTest, HostileNamesUnknownCheckpointsAndSingleHostReplicasAreRefused) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0, {"--host=hostA", "--data_plane_address=127.0.0.1"});
  cluster.StartWorker(1, {"--host=hostA", "--data_plane_address=127.0.0.1"});
  for (const std::string& bad : {std::string("mem://a/b"), std::string("mem://../etc"),
                                 "mem://" + std::string(200, 'x'), std::string("mem://")}) {
    std::vector<Child*> ranks = RunOn(cluster, {0}, "solo", "save", bad, {});
    auto [code, message] = Result(*ranks[0]);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kInvalidArgument)) << bad << ": " << message;
    EXPECT_THAT(message, HasSubstr("memory checkpoint name")) << message;
  }
  std::vector<Child*> unknown = RunOn(cluster, {0}, "solo", "load", "mem://never", {});
  EXPECT_EQ(Result(*unknown[0]).first, static_cast<int>(absl::StatusCode::kNotFound))
      << Result(*unknown[0]).second;
  EXPECT_THAT(Result(*unknown[0]).second, HasSubstr("mem://never"));
  // Both workers on hostA: no replica can be placed on another host.
  for (Child* t : RunOn(cluster, {0, 1}, "pair", "save", "mem://one-host", {})) {
    auto [code, message] = Result(*t);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kFailedPrecondition)) << message;
    EXPECT_THAT(message, HasSubstr("other hosts"));
    EXPECT_THAT(message, HasSubstr("hostA"));
  }
  EXPECT_EQ(Replicas(cluster, "one-host"), -1);
  // Asking for no copies (the trainers' save option) needs no other host: one copy per file.
  for (Child* t : RunOn(cluster, {0, 1}, "pair", "save", "mem://no-copies", {"--replicas", "0"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  EXPECT_EQ(Replicas(cluster, "no-copies"), 2);
  for (Child* t : RunOn(cluster, {1, 0}, "pair2", "load", "mem://no-copies", {})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

}  // namespace
}  // namespace ckpt::testing
