// Multi-process save/load tests: real ckpt_coordinator and ckpt_worker processes on loopback,
// trainer processes saving and loading through the client library, checkpoints checked
// bit-exact with the storage reader and `ckptctl verify`, operator-requested operations through
// `ckptctl save|load`, and failures (a worker killed mid-save, bad paths, shape mismatches).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/operation_phase.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;

TEST(ServicesTest, SaveWritesEveryRanksSharedTensorAndCommitsItBitExact) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/step1";
  Child* r0 = cluster.StartTrainer(0, "g", 0, 2, "save", path);
  Child* r1 = cluster.StartTrainer(1, "g", 1, 2, "save", path);
  ASSERT_TRUE(WaitFor([&] { return Finished(*r0) && Finished(*r1); }))  // the same ranks save again
      << r0->Stdout() << r0->Stderr() << r1->Stdout() << r1->Stderr();
  EXPECT_EQ(Result(*r0).first, 0) << Result(*r0).second;
  EXPECT_EQ(Result(*r1).first, 0) << Result(*r1).second;
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.operations_size(), 1);
  EXPECT_EQ(status.operations(0).phase(), pb::PHASE_DONE);
  EXPECT_EQ(status.operations(0).joined_ranks(), 2);
  // The save planner assigned each rank its own row: 2 x 1024 int32 elements in all.
  EXPECT_EQ(status.operations(0).bytes_total(), 2 * 1024 * 4);
  EXPECT_EQ(status.operations(0).bytes_done(), 2 * 1024 * 4);

  // Every element is what the trainers held: rank r's row holds r * 1024 + i.
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> values(2 * 1024, -1);
  ASSERT_TRUE((*reader)->ReadRegion("probe.weight", WholeRegion({2, 1024}), values.data()).ok());
  for (int i = 0; i < 2 * 1024; ++i) ASSERT_EQ(values[i], i) << "element " << i;
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;

  // Saving again to a committed checkpoint fails for every rank and leaves it intact.
  Child* again0 = cluster.StartTrainer(0, "g", 0, 2, "save", path);
  Child* again1 = cluster.StartTrainer(1, "g", 1, 2, "save", path);
  ASSERT_TRUE(WaitFor([&] { return Result(*again0).first >= 0 && Result(*again1).first >= 0; }));
  EXPECT_EQ(Result(*again0).first, static_cast<int>(absl::StatusCode::kAlreadyExists))
      << Result(*again0).second;
  EXPECT_EQ(Result(*again0).second, Result(*again1).second);
  EXPECT_THAT(Result(*again0).second, HasSubstr(path));
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
}

// A worker serving two ranks of a job joins them in one call: the first join lingers for the
// second (here up to a minute, so that the test does not depend on how far apart the two
// trainers start their saves; both do, so neither waits for the linger's end). Both trainers
// are connected before either saves (the start file): a join counts the job's open sessions.
TEST(ServicesTest, TwoRanksOnOneWorkerJoinTheCoordinatorInOneCall) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0, {"--join_linger_ms=60000"});
  const std::string path = cluster.dir() + "/pair";
  const std::string start = cluster.dir() + "/start";
  std::vector<Child*> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(cluster.StartTrainer(0, "pair", r, 2, "save", path, {"--start_file", start}));
  }
  ASSERT_TRUE(WaitFor([&] { return Shared(*ranks[0]) && Shared(*ranks[1]); }))
      << ClusterLogs(cluster);
  std::FILE* f = std::fopen(start.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  ASSERT_TRUE(WaitFor([&] { return Finished(*ranks[0]) && Finished(*ranks[1]); }))
      << ClusterLogs(cluster);
  for (Child* t : ranks) ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  // One ranks_joined line for both, whichever joined first.
  EXPECT_THAT(cluster.coordinator().Stderr(), HasSubstr(" job=pair ranks=2 "))
      << ClusterLogs(cluster);
}

TEST(ServicesTest, SaveReturnsAtTheSnapshotAndTheCheckpointHoldsPreMutationValues) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/async";
  // 200 MB per rank: the trainers overwrite their tensors while the workers still write.
  const int64_t elements = 50000000;
  std::vector<Child*> ranks =
      RunRanks(cluster, "async", 2, "save_mutate", path, {"--elements", absl::StrCat(elements)});
  for (Child* t : ranks) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
    EXPECT_NE(t->Stdout().find("mutated"), std::string::npos);
  }
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> values(2 * elements);
  ASSERT_TRUE(
      (*reader)->ReadRegion("probe.weight", WholeRegion({2, elements}), values.data()).ok());
  for (int64_t i = 0; i < 2 * elements; ++i) {
    ASSERT_EQ(values[i], static_cast<int32_t>(i)) << "element " << i;
  }
}

TEST(ServicesTest, ABlockingSaveLendsEveryHostTensorAndCopiesNothing) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/blocking";
  std::vector<Child*> ranks = RunRanks(cluster, "blocking", 2, "save_and_wait", path, {});
  for (Child* t : ranks) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
    // Each rank writes its own 1024-element int32 row, from the trainer's memory.
    EXPECT_THAT(t->Stdout(), HasSubstr("snapshot copied_bytes=0 lent_bytes=4096")) << t->Stdout();
  }
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> values(2 * 1024, -1);
  ASSERT_TRUE((*reader)->ReadRegion("probe.weight", WholeRegion({2, 1024}), values.data()).ok());
  for (int i = 0; i < 2 * 1024; ++i) ASSERT_EQ(values[i], i) << "element " << i;
}

TEST(ServicesTest, WorkerKilledMidSaveAbortsEveryRankAndNothingIsCommitted) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  // A previous checkpoint of the job, which must come through intact.
  const std::string previous = cluster.dir() + "/previous";
  for (Child* t : RunRanks(cluster, "big", 2, "save", previous, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  const std::string path = cluster.dir() + "/big";
  // 400 MB per rank, so that writing takes long enough to kill a worker in the middle.
  const std::vector<std::string> big = {"--elements", "100000000"};
  Child* r0 = cluster.StartTrainer(0, "big", 0, 2, "save", path, big);
  Child* r1 = cluster.StartTrainer(1, "big", 1, 2, "save", path, big);
  auto last_phase = [&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() == 2 ? s.operations(1).phase() : pb::PHASE_UNSPECIFIED;
  };
  ASSERT_TRUE(WaitFor([&] { return last_phase() == pb::PHASE_EXECUTING; }))
      << r0->Stdout() << r0->Stderr();
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0);
  EXPECT_THAT(out, HasSubstr("executing  requested by rank"));
  EXPECT_THAT(out, HasSubstr("/ 762.94 MiB"));  // progress bar over the plan's bytes
  pid_t victim = cluster.worker(1).pid;
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }))
      << r0->Stdout() << r1->Stdout();
  auto [code, message] = Result(*r0);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kUnavailable)) << message;
  EXPECT_THAT(message, HasSubstr(absl::StrCat("worker ", cluster.worker_id(1), " (pid ", victim)));
  EXPECT_THAT(message, HasSubstr("missed its lease"));
  EXPECT_NE(Result(*r1).first, 0);  // its worker is gone: the trainer hears so, no hang
  EXPECT_EQ(last_phase(), pb::PHASE_ABORTED);
  // Never committed, and the staging directory is cleaned up.
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
  EXPECT_TRUE(WaitFor([&] {
    return std::system(("ls -a " + cluster.dir() + " | grep -q '^\\.big'").c_str()) != 0;
  })) << "staging directory left behind";
  EXPECT_EQ(cluster.RunCkptctl({"verify", previous}, &out), 0) << out;
}

TEST(ServicesTest, WorkerKilledMidLoadFailsEveryRankWithoutHanging) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/big";
  const std::vector<std::string> big = {"--elements", "100000000"};  // 400 MB per rank
  for (Child* t : RunRanks(cluster, "big", 2, "save", path, big)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  // Reading from the page cache is fast: try again when a load finished before the kill.
  bool killed = false;
  int w1 = 1;  // the worker serving rank 1 (replaced after a kill that came too late)
  // Loaded as column blocks, each rank needs half of the row the other rank reads: the
  // workers exchange them (broadcast, 64 MiB waves) when the worker of rank 1 is killed.
  std::vector<std::string> load_args = big;
  for (const char* a : {"--layout", "cols", "--algorithm", "broadcast", "--budget", "67108864"}) {
    load_args.push_back(a);
  }
  for (int attempt = 0; attempt < 3 && !killed; ++attempt) {
    Child* r0 = cluster.StartTrainer(0, "big", 0, 2, "load", path, load_args);
    Child* r1 = cluster.StartTrainer(w1, "big", 1, 2, "load", path, load_args);
    const int op_index = attempt + 1;
    pb::OperationPhase phase = pb::PHASE_UNSPECIFIED;
    ASSERT_TRUE(WaitFor([&] {
      pb::GetStatusResponse s = cluster.Status();
      phase =
          s.operations_size() > op_index ? s.operations(op_index).phase() : pb::PHASE_UNSPECIFIED;
      return phase == pb::PHASE_EXECUTING || IsFinal(phase);
    }));
    if (phase != pb::PHASE_EXECUTING) {  // the next attempt starts the same ranks
      ASSERT_TRUE(WaitFor([&] { return Finished(*r0) && Finished(*r1); })) << ClusterLogs(cluster);
      continue;
    }
    pid_t victim = cluster.worker(w1).pid;
    std::string victim_id = cluster.worker_id(w1);
    cluster.worker(w1).Kill(SIGKILL);
    ASSERT_TRUE(WaitFor([&] { return Finished(*r0) && Finished(*r1); }))
        << r0->Stdout() << r1->Stdout();
    if (Result(*r0).first == 0) {  // rank 1 had reported just before the kill: again
      w1 = cluster.StartWorker(1);
      continue;
    }
    killed = true;
    EXPECT_EQ(Result(*r0).first, static_cast<int>(absl::StatusCode::kUnavailable))
        << Result(*r0).second;
    EXPECT_THAT(Result(*r0).second,
                HasSubstr(absl::StrCat("worker ", victim_id, " (pid ", victim)));
    EXPECT_NE(Result(*r1).first, 0);  // its worker is gone: the trainer hears so, no hang
  }
  EXPECT_TRUE(killed) << "every load finished before a worker could be killed";
}

TEST(ServicesTest, TwoJobsSaveThroughOneCoordinatorAtOnceWithoutInterfering) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string a = cluster.dir() + "/job-a", b = cluster.dir() + "/job-b";
  const std::vector<std::string> mid = {"--elements", "2000000"};
  std::vector<Child*> trainers = {cluster.StartTrainer(0, "A", 0, 2, "save", a, mid),
                                  cluster.StartTrainer(1, "A", 1, 2, "save", a, mid),
                                  cluster.StartTrainer(2, "B", 0, 2, "save", b, mid),
                                  cluster.StartTrainer(3, "B", 1, 2, "save", b, mid)};
  ASSERT_TRUE(WaitFor([&] {
    for (Child* t : trainers) {
      if (Result(*t).first < 0) return false;
    }
    return true;
  }));
  for (Child* t : trainers) EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.operations_size(), 2);
  EXPECT_NE(status.operations(0).job(), status.operations(1).job());
  for (const std::string& path : {a, b}) {
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<int32_t> values(2 * 2000000);
    ASSERT_TRUE(
        (*reader)->ReadRegion("probe.weight", WholeRegion({2, 2000000}), values.data()).ok());
    for (int i = 0; i < static_cast<int>(values.size()); ++i) {
      ASSERT_EQ(values[i], i) << path << " element " << i;
    }
  }
}

TEST(ServicesTest, SaveThenLoadIntoOtherLayoutsIsBitExact) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/saved";
  // Saved by 2 ranks as DTensor Shard(0) of a (5, 1000) tensor: rows 0-2 and 3-4.
  for (Child* t : RunRanks(cluster, "train", 2, "save", path,
                           {"--layout", "dtensor", "--global_rows", "5", "--elements", "1000"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  {
    // The manifest records how the tensor was laid out when saved.
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const pb::SavedLayout& layout = (*reader)->manifest().saved_layout();
    EXPECT_EQ(layout.world_size(), 2);
    EXPECT_THAT(layout.mesh_shape(), ::testing::ElementsAre(2));
    ASSERT_EQ(layout.tensors_size(), 1);
    EXPECT_EQ(layout.tensors(0).key(), "probe.weight");
    ASSERT_EQ(layout.tensors(0).placements_size(), 1);
    EXPECT_EQ(layout.tensors(0).placements(0).shard_dim(), 0);
  }
  // Loaded by 3 ranks (rows 0-1, 2-3, 4: uneven, across the saved boundary) and by 4 ranks
  // holding flat ranges of the flattened tensor; every element is checked by the trainers.
  struct Target {
    std::string job;
    int world;
    std::string layout;
  };
  // The same job restarts at each new world size once all its ranks left their workers.
  auto job_left = [&] {
    pb::GetStatusResponse st = cluster.Status();
    return st.jobs_size() == 1 && st.jobs(0).ranks_size() == 0;
  };
  for (const Target& target : {Target{"train", 3, "dtensor"}, Target{"train", 4, "flat"}}) {
    ASSERT_TRUE(WaitFor(job_left));
    for (Child* t :
         RunRanks(cluster, target.job, target.world, "load", path,
                  {"--layout", target.layout, "--global_rows", "5", "--elements", "1000"})) {
      EXPECT_EQ(Result(*t).first, 0) << target.world << " ranks: " << Result(*t).second;
      EXPECT_FALSE(LineValue(t->Stdout(), "verified").empty()) << target.job << ": " << t->Stdout();
    }
  }
  // A load whose shape disagrees with the checkpoint is refused for every rank, naming it.
  ASSERT_TRUE(WaitFor(job_left));
  for (Child* t : RunRanks(cluster, "train", 2, "load", path,
                           {"--layout", "dtensor", "--global_rows", "6", "--elements", "1000"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(Result(*t).second, HasSubstr("tensor probe.weight as DTYPE_I32(6, 1000)"));
  }
  // So is a load of a checkpoint that does not exist.
  for (Child* t : RunRanks(cluster, "missing", 1, "load", cluster.dir() + "/nothing", {})) {
    EXPECT_NE(Result(*t).first, 0);
    EXPECT_THAT(Result(*t).second, HasSubstr(cluster.dir() + "/nothing"));
  }
}

TEST(ServicesTest, SaveToAnUnwritablePathFailsForEveryRankAndLeavesNothing) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string file = cluster.dir() + "/a-file";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const std::string path = file + "/ckpt";  // parent is a regular file
  Child* r0 = cluster.StartTrainer(0, "bad", 0, 2, "save", path);
  Child* r1 = cluster.StartTrainer(1, "bad", 1, 2, "save", path);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }));
  EXPECT_NE(Result(*r0).first, 0);
  EXPECT_EQ(Result(*r0).second, Result(*r1).second);
  EXPECT_THAT(Result(*r0).second, HasSubstr("planning failed"));
  EXPECT_THAT(Result(*r0).second, HasSubstr(path));
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
}

TEST(ServicesTest, CkptctlSaveIsTakenAtTheTrainersNextPollAndWaitsForTheCommit) {
  Cluster cluster;
  // No worker dies here: a lease of seconds, not kLeaseMs (under ASan on a loaded 2-core CI
  // machine, the worker once missed the 600 ms lease and the save was aborted for it).
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=5000"}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  const std::string path = cluster.dir() + "/operator-ckpt";
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "polled",
                                "--timeout", "60s", path},
                               &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("committed at " + path));
  EXPECT_THAT(out, HasSubstr("4096 bytes"));
  EXPECT_EQ(access((path + "/manifest.pb").c_str(), F_OK), 0);  // durable before it returned
  ASSERT_TRUE(WaitFor([&] { return Result(*trainer).first >= 0; }));
  EXPECT_EQ(Result(*trainer).first, 0) << Result(*trainer).second;
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.operations_size(), 1);
  EXPECT_EQ(status.operations(0).requested_by(), "operator");
  EXPECT_EQ(status.operations(0).phase(), pb::PHASE_DONE);
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
}

TEST(ServicesTest, CkptctlLoadRollsARunningJobBackAtItsNextPoll) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/rollback";
  for (Child* t : RunRanks(cluster, "job", 2, "save", path, {"--layout", "dtensor"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  std::vector<Child*> trainers = {
      cluster.StartTrainer(0, "job", 0, 2, "poll", "", {"--layout", "dtensor"}),
      cluster.StartTrainer(1, "job", 1, 2, "poll", "", {"--layout", "dtensor"})};
  ASSERT_TRUE(WaitFor([&] { return Shared(*trainers[0]) && Shared(*trainers[1]); }));
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "job",
                                "--algorithm", "overlap_all_to_all", path},
                               &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("load: job job, 2 ranks, 8192 bytes"));
  EXPECT_THAT(out, HasSubstr("8192 bytes read from storage"));
  for (Child* t : trainers) {
    ASSERT_TRUE(WaitFor([&] { return Result(*t).first >= 0; }));
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
}

TEST(ServicesTest, CkptctlSaveOfAnUnknownJobOrWithoutArgumentsFails) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl(
                {"save", "--coordinator", cluster.address(), "--job", "nope", cluster.dir() + "/x"},
                &out),
            1);
  EXPECT_THAT(out, HasSubstr("job nope is unknown"));
  EXPECT_EQ(cluster.RunCkptctl({"load", "--job", "nope"}, &out), 2);
  EXPECT_THAT(out, HasSubstr("are required"));
  EXPECT_EQ(cluster.RunCkptctl({"save", "--help"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("usage: ckptctl save"));
}

}  // namespace
}  // namespace ckpt::testing
