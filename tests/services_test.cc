// Multi-process tests of the daemons: a real ckpt_coordinator and real ckpt_worker processes on
// loopback, trainer processes using the client library over the workers' unix sockets, and
// ckptctl status. Short leases and deadlines; every process is killed by the Cluster.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;

const pb::WorkerStatus* FindWorker(const pb::GetStatusResponse& s, const std::string& id) {
  for (const auto& w : s.workers()) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

int LiveWorkers(const pb::GetStatusResponse& s) {
  int n = 0;
  for (const auto& w : s.workers()) n += w.alive() ? 1 : 0;
  return n;
}

// "result <code> <message>" of a finished trainer; code -1 while it has not printed one.
std::pair<int, std::string> Result(const Child& trainer) {
  std::string value = LineValue(trainer.Stdout(), "result");
  if (value.empty()) return {-1, ""};
  std::pair<std::string, std::string> parts = absl::StrSplit(value, absl::MaxSplits(' ', 1));
  int code = -1;
  (void)absl::SimpleAtoi(parts.first, &code);
  return {code, parts.second};
}

bool SegmentExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

pb::WorkerStatusResponse WorkerStatus(Cluster& cluster, int i) {
  auto stub = cluster.WorkerStub(i);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  pb::WorkerStatusResponse response;
  grpc::Status s = stub->Status(&context, pb::WorkerStatusRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

TEST(ServicesTest, WorkersRegisterAnnounceThemselvesAndKeepTheirLeases) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 3; ++i) cluster.StartWorker(i);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 3; }));
  pb::GetStatusResponse status = cluster.Status();
  for (int i = 0; i < 3; ++i) {
    const pb::WorkerStatus* w = FindWorker(status, cluster.worker_id(i));
    ASSERT_NE(w, nullptr) << cluster.worker_id(i);
    EXPECT_EQ(w->info().pid(), cluster.worker(i).pid);
    EXPECT_EQ(w->info().local_rank(), i);
    EXPECT_FALSE(w->info().host().empty());
    EXPECT_FALSE(w->info().data_plane_address().empty());
    EXPECT_THAT(w->info().memory_kinds(), ::testing::Contains("host"));
  }
  // Heartbeats renew the leases: after several lease periods every worker is still alive.
  absl::SleepFor(absl::Milliseconds(4 * kLeaseMs));
  EXPECT_EQ(LiveWorkers(cluster.Status()), 3);
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("workers: 3 live, 0 dead"));
}

TEST(ServicesTest, KilledWorkerIsReportedDeadNamingHostAndPid) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 3; ++i) cluster.StartWorker(i);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 3; }));
  pid_t victim = cluster.worker(1).pid;
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] {
    const pb::WorkerStatus* w = FindWorker(cluster.Status(), cluster.worker_id(1));
    return w != nullptr && !w->alive();
  }));
  pb::GetStatusResponse status = cluster.Status();
  const pb::WorkerStatus* dead = FindWorker(status, cluster.worker_id(1));
  EXPECT_EQ(dead->info().pid(), victim);
  EXPECT_THAT(dead->death_cause(), HasSubstr("missed its lease"));
  EXPECT_EQ(LiveWorkers(status), 2);
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("workers: 2 live, 1 dead"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(cluster.worker_id(1), "  DEAD")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pid=", victim)));
  EXPECT_THAT(out, HasSubstr("missed its lease"));
}

TEST(ServicesTest, TrainerSharesATensorThroughSharedMemoryReleasedWhenItDies) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "shm-job", 0, 1, "hold");
  ASSERT_TRUE(WaitFor([&] {
    return trainer->Stdout().find("shared") != std::string::npos || !trainer->Running();
  })) << trainer->Stdout()
      << trainer->Stderr();
  ASSERT_TRUE(trainer->Running()) << trainer->Stdout() << trainer->Stderr();
  std::vector<std::string> seg = absl::StrSplit(LineValue(trainer->Stdout(), "segment"), ' ');
  ASSERT_EQ(seg.size(), 2u);
  const std::string& name = seg[0];
  int64_t nbytes = 0;
  ASSERT_TRUE(absl::SimpleAtoi(seg[1], &nbytes));
  EXPECT_EQ(nbytes, 1024 * 4);

  // The bytes the trainer wrote are visible in the shared segment.
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0) << name;
  void* addr = mmap(nullptr, nbytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(addr, MAP_FAILED);
  for (int i = 0; i < 1024; ++i) {
    int32_t v = 0;
    std::memcpy(&v, static_cast<char*>(addr) + 4 * i, 4);
    ASSERT_EQ(v, i) << "element " << i;
  }
  munmap(addr, nbytes);

  // The worker holds the session with that segment; the coordinator knows the rank.
  pb::WorkerStatusResponse ws = WorkerStatus(cluster, 0);
  ASSERT_EQ(ws.sessions_size(), 1);
  EXPECT_EQ(ws.sessions(0).pid(), trainer->pid);
  EXPECT_THAT(ws.sessions(0).segments(), ::testing::ElementsAre(name));
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).name(), "shm-job");
  ASSERT_EQ(status.jobs(0).ranks_size(), 1);
  EXPECT_EQ(status.jobs(0).ranks(0).worker_id(), cluster.worker_id(0));

  // SIGKILL leaves the trainer no chance to clean up: the worker releases its segment.
  trainer->Kill(SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return !SegmentExists(name); })) << name << " still exists";
  EXPECT_TRUE(WaitFor([&] { return WorkerStatus(cluster, 0).sessions_size() == 0; }));
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("trainer_gone"));
  EXPECT_TRUE(cluster.worker(0).Running());  // the worker keeps serving
}

TEST(ServicesTest, SaveWritesEveryRanksSharedTensorAndCommitsItBitExact) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/step1";
  Child* r0 = cluster.StartTrainer(0, "g", 0, 2, "save", path);
  Child* r1 = cluster.StartTrainer(1, "g", 1, 2, "save", path);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }))
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

TEST(ServicesTest, WorkerKilledMidSaveAbortsEveryRankAndNothingIsCommitted) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/big";
  // 400 MB per rank, so that writing takes long enough to kill a worker in the middle.
  const std::vector<std::string> big = {"--elements", "100000000"};
  Child* r0 = cluster.StartTrainer(0, "big", 0, 2, "save", path, big);
  Child* r1 = cluster.StartTrainer(1, "big", 1, 2, "save", path, big);
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() == 1 && s.operations(0).phase() == pb::PHASE_EXECUTING;
  })) << r0->Stdout()
      << r0->Stderr();
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0);
  EXPECT_THAT(out, HasSubstr("executing  requested by rank"));
  EXPECT_THAT(out, HasSubstr("/ 762.9 MiB"));  // progress bar over the plan's bytes
  pid_t victim = cluster.worker(1).pid;
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }))
      << r0->Stdout() << r1->Stdout();
  auto [code, message] = Result(*r0);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kUnavailable)) << message;
  EXPECT_THAT(message, HasSubstr(absl::StrCat("worker ", cluster.worker_id(1), " (pid ", victim)));
  EXPECT_THAT(message, HasSubstr("missed its lease"));
  EXPECT_NE(Result(*r1).first, 0);  // its worker is gone: the trainer hears so, no hang
  EXPECT_EQ(cluster.Status().operations(0).phase(), pb::PHASE_ABORTED);
  // Never committed, and the staging directory is cleaned up.
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
  EXPECT_TRUE(WaitFor([&] {
    return std::system(("ls -a " + cluster.dir() + " | grep -q '^\\.big'").c_str()) != 0;
  })) << "staging directory left behind";
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

// Runs `world` trainers of `job` in `mode` on workers 0..world-1 and waits for their results.
std::vector<Child*> RunRanks(Cluster& cluster, const std::string& job, int world,
                             const std::string& mode, const std::string& path,
                             const std::vector<std::string>& extra) {
  std::vector<Child*> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(cluster.StartTrainer(r, job, r, world, mode, path, extra));
  }
  EXPECT_TRUE(WaitFor([&] {
    for (Child* t : ranks) {
      if (Result(*t).first < 0) return false;
    }
    return true;
  }));
  return ranks;
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
  // Loaded by 3 ranks (rows 0-1, 2-3, 4: uneven, across the saved boundary) and by 4 ranks
  // holding flat ranges of the flattened tensor; every element is checked by the trainers.
  struct Target {
    std::string job;
    int world;
    std::string layout;
  };
  for (const Target& target : {Target{"restore3", 3, "dtensor"}, Target{"restore4", 4, "flat"}}) {
    for (Child* t :
         RunRanks(cluster, target.job, target.world, "load", path,
                  {"--layout", target.layout, "--global_rows", "5", "--elements", "1000"})) {
      EXPECT_EQ(Result(*t).first, 0) << target.job << ": " << Result(*t).second;
      EXPECT_FALSE(LineValue(t->Stdout(), "verified").empty()) << target.job << ": " << t->Stdout();
    }
  }
  // A load whose shape disagrees with the checkpoint is refused for every rank, naming it.
  for (Child* t : RunRanks(cluster, "wrong", 2, "load", path,
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

TEST(ServicesTest, RankThatNeverArrivesAbortsEveryRankNamingIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(
      {absl::StrCat("--lease_ms=", kLeaseMs), "--arrival_deadline_ms=1500"}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  Child* r0 = cluster.StartTrainer(0, "late", 0, 3, "save");
  Child* r1 = cluster.StartTrainer(1, "late", 1, 3, "save");
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }))
      << r0->Stdout() << r0->Stderr();
  for (Child* r : {r0, r1}) {
    auto [code, message] = Result(*r);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kDeadlineExceeded)) << message;
    EXPECT_THAT(message, HasSubstr("rank 2 (its trainer never connected"));
    EXPECT_THAT(message, HasSubstr("did not join within 1.5s"));
  }
}

TEST(ServicesTest, WorkerKilledWhileGatheringAbortsTheOtherRanksNamingHostAndCause) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(
      {absl::StrCat("--lease_ms=", kLeaseMs), "--arrival_deadline_ms=60000"}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  Child* r1 = cluster.StartTrainer(1, "crash", 1, 2, "hold");  // attached, never saves
  ASSERT_TRUE(WaitFor([&] { return r1->Stdout().find("shared") != std::string::npos; }))
      << r1->Stdout() << r1->Stderr();
  Child* r0 = cluster.StartTrainer(0, "crash", 0, 2, "save");
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() == 1 && s.operations(0).joined_ranks() == 1;
  }));
  pid_t victim = cluster.worker(1).pid;
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0; })) << r0->Stdout() << r0->Stderr();
  auto [code, message] = Result(*r0);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kUnavailable)) << message;
  EXPECT_THAT(message, HasSubstr(absl::StrCat("rank 1 (host ")));
  EXPECT_THAT(message, HasSubstr(absl::StrCat("worker ", cluster.worker_id(1), " (pid ", victim)));
  EXPECT_THAT(message, HasSubstr("missed its lease"));

  // Rank 1's trainer dies too while no worker serves it: its segment is orphaned until the
  // next worker on this host starts and sweeps it.
  std::string orphan = LineValue(r1->Stdout(), "segment");
  orphan = orphan.substr(0, orphan.find(' '));
  r1->Kill(SIGKILL);
  EXPECT_TRUE(SegmentExists(orphan));
  cluster.StartWorker(1);
  EXPECT_TRUE(WaitFor([&] { return !SegmentExists(orphan); })) << orphan;
}

TEST(ServicesTest, CkptctlSaveIsTakenAtTheTrainersNextPollAndWaitsForTheCommit) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  const std::string path = cluster.dir() + "/operator-ckpt";
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "polled",
                                "--timeout_s", "60", path},
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
  ASSERT_TRUE(WaitFor([&] {
    return trainers[0]->Stdout().find("shared") != std::string::npos &&
           trainers[1]->Stdout().find("shared") != std::string::npos;
  }));
  std::string out;
  ASSERT_EQ(
      cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "job", path}, &out),
      0)
      << out;
  EXPECT_THAT(out, HasSubstr("load: job job, 2 ranks, 8192 bytes"));
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

TEST(ServicesTest, WorkerReRegistersAndReattachesItsRanksAfterTheCoordinatorRestarts) {
  Cluster cluster;
  const std::string lease = absl::StrCat("--lease_ms=", kLeaseMs);
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({lease}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "survivor", 0, 1, "hold");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({lease}));
  // The new coordinator knows nothing; the worker's next heartbeat is refused, it registers
  // again and re-attaches the rank of its live trainer.
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return LiveWorkers(s) == 1 && s.workers(0).info().pid() == cluster.worker(0).pid &&
           s.jobs_size() == 1 && s.jobs(0).ranks_size() == 1;
  })) << cluster.worker(0).Stderr();
  EXPECT_EQ(cluster.Status().jobs(0).name(), "survivor");
  EXPECT_TRUE(trainer->Running());
}

TEST(ServicesTest, SigtermStopsDaemonsCleanly) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 2; }));
  // A worker stopped with SIGTERM leaves the registry at once (it is not reported dead).
  kill(cluster.worker(0).pid, SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return !cluster.worker(0).Running(); }));
  EXPECT_TRUE(WIFEXITED(cluster.worker(0).status) && WEXITSTATUS(cluster.worker(0).status) == 0)
      << cluster.worker(0).Stderr();
  EXPECT_EQ(access(cluster.worker_socket(0).c_str(), F_OK), -1);  // socket removed
  pb::GetStatusResponse status = cluster.Status();
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).worker_id(), cluster.worker_id(1));
  // The coordinator stops promptly although worker 1 holds a WatchWork stream open.
  kill(cluster.coordinator().pid, SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return !cluster.coordinator().Running(); }, absl::Seconds(10)));
  EXPECT_TRUE(WIFEXITED(cluster.coordinator().status) &&
              WEXITSTATUS(cluster.coordinator().status) == 0)
      << cluster.coordinator().Stderr();
}

TEST(ServicesTest, CkptctlStatusNeedsACoordinator) {
  Cluster cluster;
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"status"}, &out), 2);
  EXPECT_THAT(out, HasSubstr("--coordinator HOST:PORT is required"));
  EXPECT_EQ(cluster.RunCkptctl({"status", "--help"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("usage: ckptctl status"));
  EXPECT_EQ(
      cluster.RunCkptctl({"status", "--coordinator", "127.0.0.1:1", "--timeout_ms", "300"}, &out),
      1);
  EXPECT_THAT(out, HasSubstr("GetStatus at coordinator 127.0.0.1:1"));
}

}  // namespace
}  // namespace ckpt::testing
