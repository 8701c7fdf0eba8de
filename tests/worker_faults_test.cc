// Multi-process tests of workers that stop answering: real ckpt_coordinator and ckpt_worker
// processes on loopback, trainers loading through the client library, a worker frozen with
// SIGSTOP past its lease and resumed with SIGCONT. Nothing may crash, no worker may write a
// trainer's memory once the load was aborted, and every rank hears the real cause.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/operation_phase.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;
// Rank r's trainer runs on worker kWorkerOf[r]: rank 0 alone on worker 0, ranks 1 and 2 share
// worker 1 (the one frozen below).
constexpr int kWorkerOf[] = {0, 1, 1};
constexpr int kRanks = 3;

std::vector<Child*> StartRanks(Cluster& cluster, const std::string& job, const std::string& mode,
                               const std::string& path, const std::vector<std::string>& args) {
  std::vector<Child*> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(cluster.StartTrainer(kWorkerOf[r], job, r, kRanks, mode, path, args));
  }
  return ranks;
}

// Whether every rank printed its result and exited (Finished: the next attempt starts the same
// ranks on the same workers).
bool AllExited(const std::vector<Child*>& ranks) {
  for (Child* t : ranks) {
    if (!Finished(*t)) return false;
  }
  return true;
}

// The phase of the operation `index` (creation order) in the coordinator's status.
pb::OperationPhase PhaseOf(Cluster& cluster, int index) {
  pb::GetStatusResponse s = cluster.Status();
  return s.operations_size() > index ? s.operations(index).phase() : pb::PHASE_UNSPECIFIED;
}

int64_t BytesDone(Cluster& cluster, int index) {
  pb::GetStatusResponse s = cluster.Status();
  return s.operations_size() > index ? s.operations(index).bytes_done() : 0;
}

std::string OperationId(Cluster& cluster, int index) {
  pb::GetStatusResponse s = cluster.Status();
  return s.operations_size() > index ? s.operations(index).id() : "";
}

// Whether worker `w` logged the end of its part of `op` (or is no longer running).
bool PartEnded(Cluster& cluster, int w, const std::string& op) {
  return cluster.worker(w).Stderr().find("load_part_done op=" + op + " ") != std::string::npos ||
         !cluster.worker(w).Running();
}

// The scenario: SIGSTOP a worker during a load, leave it past its lease (and past the
// trainer's Wait call of 30 s + its RPC timeout), SIGCONT it. Before, the resumed worker
// segfaulted in a memcpy into the segment of a trainer that had died meanwhile (taking the
// other ranks it served with it), the surviving worker finished its exchange wave and wrote
// into its trainer's memory after the trainer had been told the load was aborted, and the
// frozen worker's own rank heard "Wait: Deadline Exceeded" instead of the abort.
TEST(WorkerFaultsTest, AWorkerFrozenPastItsLeaseAndResumedNeitherCrashesNorWritesAnAbortedLoad) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/big";
  const std::vector<std::string> size = {"--elements", "25000000"};  // 100 MB per rank
  std::vector<Child*> savers = StartRanks(cluster, "big", "save", path, size);
  ASSERT_TRUE(WaitFor([&] { return AllExited(savers); })) << ClusterLogs(cluster);
  for (Child* t : savers) ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;

  // Loaded as column blocks, every rank needs a part of every stored row: the workers
  // exchange them in 16 MiB waves. Reading from the page cache is fast, so try again when a
  // load finished before the worker could be frozen.
  const std::string check_file = cluster.dir() + "/check";
  std::vector<std::string> load_args = size;
  for (const std::string& a :
       {std::string("--layout"), std::string("cols"), std::string("--algorithm"),
        std::string("broadcast"), std::string("--budget"), std::string("16777216"),
        std::string("--rpc_timeout_ms"), std::string("2000"), std::string("--check_file"),
        check_file}) {
    load_args.push_back(a);
  }
  std::vector<Child*> loaders;
  int op_index = 0;
  bool frozen = false;
  absl::Time frozen_at;
  for (int attempt = 0; attempt < 3 && !frozen; ++attempt) {
    loaders = StartRanks(cluster, "big", "load", path, load_args);
    op_index = attempt + 1;
    // Frozen once the ranks exchange: some wave was scattered, so every worker joined the
    // operation's communicator.
    ASSERT_TRUE(WaitFor([&] {
      pb::OperationPhase p = PhaseOf(cluster, op_index);
      return (p == pb::PHASE_EXECUTING && BytesDone(cluster, op_index) > 0) || IsFinal(p);
    })) << ClusterLogs(cluster);
    if (PhaseOf(cluster, op_index) == pb::PHASE_EXECUTING) {
      kill(cluster.worker(1).pid, SIGSTOP);
      frozen_at = absl::Now();
      frozen = PhaseOf(cluster, op_index) == pb::PHASE_EXECUTING;
      if (!frozen) kill(cluster.worker(1).pid, SIGCONT);
    }
    if (!frozen) {
      ASSERT_TRUE(WaitFor([&] { return AllExited(loaders); })) << ClusterLogs(cluster);
    }
  }
  ASSERT_TRUE(frozen) << "every load finished before a worker could be frozen";
  const std::string op = OperationId(cluster, op_index);
  const std::string frozen_id = cluster.worker_id(1);

  // Rank 2's trainer dies while its worker is frozen: the resumed worker releases its session.
  loaders[2]->Kill(SIGKILL);
  // The coordinator declares the frozen worker dead and aborts the load for every rank.
  ASSERT_TRUE(WaitFor([&] {
    const pb::GetStatusResponse s = cluster.Status();  // outlives the pointer into it
    const pb::WorkerStatus* w = FindWorker(s, frozen_id);
    return w != nullptr && !w->alive() && PhaseOf(cluster, op_index) == pb::PHASE_ABORTED;
  })) << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return Result(*loaders[0]).first >= 0; })) << ClusterLogs(cluster);
  EXPECT_EQ(Result(*loaders[0]).first, static_cast<int>(absl::StatusCode::kUnavailable))
      << Result(*loaders[0]).second;
  EXPECT_THAT(Result(*loaders[0]).second, HasSubstr(absl::StrCat("worker ", frozen_id, " (pid ")));
  EXPECT_THAT(Result(*loaders[0]).second, HasSubstr("missed its lease"));
  // From here on rank 0's tensor holds a sentinel that no worker may overwrite.
  ASSERT_TRUE(WaitFor([&] { return loaders[0]->Stdout().find("sentinel") != std::string::npos; }))
      << loaders[0]->Stdout() << loaders[0]->Stderr();

  // The scenario needs the freeze to outlast rank 1's Wait call to its worker (a 30 s slice
  // plus the trainer's 2 s RPC timeout): a duration, not an ordering, so it is waited out,
  // watching (every 20 ms) that rank 1 does not give up meanwhile.
  const absl::Time freeze_until = frozen_at + absl::Seconds(34);
  WaitFor([&] { return Result(*loaders[1]).first != -1 || absl::Now() >= freeze_until; },
          absl::Seconds(40));
  EXPECT_EQ(Result(*loaders[1]).first, -1)
      << "rank 1 gave up while its worker was frozen: " << Result(*loaders[1]).second;
  kill(cluster.worker(1).pid, SIGCONT);

  // Rank 1, served by the frozen worker, hears the real cause once its worker answers again.
  ASSERT_TRUE(WaitFor([&] { return Result(*loaders[1]).first >= 0; })) << ClusterLogs(cluster);
  EXPECT_EQ(Result(*loaders[1]).first, static_cast<int>(absl::StatusCode::kUnavailable))
      << Result(*loaders[1]).second;
  EXPECT_THAT(Result(*loaders[1]).second, HasSubstr(absl::StrCat("worker ", frozen_id, " (pid ")));
  EXPECT_THAT(Result(*loaders[1]).second, HasSubstr("missed its lease"));
  ASSERT_TRUE(WaitFor([&] { return loaders[1]->Stdout().find("sentinel") != std::string::npos; }))
      << loaders[1]->Stdout() << loaders[1]->Stderr();

  // Both workers' parts of the aborted load end, and the resumed worker is still serving.
  ASSERT_TRUE(WaitFor([&] { return PartEnded(cluster, 0, op) && PartEnded(cluster, 1, op); }))
      << ClusterLogs(cluster);
  EXPECT_TRUE(cluster.worker(1).Running()) << "the resumed worker died:\n" << ClusterLogs(cluster);
  EXPECT_TRUE(cluster.worker(0).Running()) << ClusterLogs(cluster);
  // Nothing wrote into the trainers' memory after their load was reported aborted.
  FILE* f = std::fopen(check_file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (int r : {0, 1}) {
    ASSERT_TRUE(WaitFor([&] { return !loaders[r]->Running(); })) << loaders[r]->Stdout();
    EXPECT_THAT(loaders[r]->Stdout(), HasSubstr("untouched")) << "rank " << r << "\n"
                                                              << ClusterLogs(cluster);
  }

  // The resumed worker registered again and serves new operations.
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 2; })) << ClusterLogs(cluster);
  std::vector<Child*> after = StartRanks(cluster, "after", "save", cluster.dir() + "/after", {});
  ASSERT_TRUE(WaitFor([&] { return AllExited(after); })) << ClusterLogs(cluster);
  for (Child* t : after) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << "\n" << ClusterLogs(cluster);
  }
}

}  // namespace
}  // namespace ckpt::testing
