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
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;

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
    EXPECT_THAT(w->info().memory_kinds(), ::testing::Contains(pb::MEMORY_HOST));
  }
  // Heartbeats renew the leases: for four lease periods (a duration, so it is waited out,
  // looking at the status every 20 ms) every worker stays alive, and each is seen renewing
  // (the time since its last heartbeat drops).
  std::map<std::string, int64_t> last_ms;
  std::set<std::string> renewed;
  const absl::Time until = absl::Now() + absl::Milliseconds(4 * kLeaseMs);
  bool all_alive = true;
  WaitFor([&] {
    const pb::GetStatusResponse s = cluster.Status();
    all_alive = all_alive && LiveWorkers(s) == 3;
    for (const pb::WorkerStatus& w : s.workers()) {
      auto previous = last_ms.find(w.worker_id());
      if (previous != last_ms.end() && w.ms_since_heartbeat() < previous->second) {
        renewed.insert(w.worker_id());
      }
      last_ms[w.worker_id()] = w.ms_since_heartbeat();
    }
    return !all_alive || absl::Now() >= until;
  });
  EXPECT_TRUE(all_alive) << "a worker died although it kept sending heartbeats";
  EXPECT_EQ(renewed.size(), 3u);
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
    const pb::GetStatusResponse s = cluster.Status();  // outlives the pointer into it
    const pb::WorkerStatus* w = FindWorker(s, cluster.worker_id(1));
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
  ASSERT_TRUE(WaitFor([&] { return Shared(*trainer) || !trainer->Running(); }))
      << trainer->Stdout() << trainer->Stderr();
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
  EXPECT_TRUE(WaitFor([&] {
    return cluster.worker(0).Stderr().find("trainer_gone") != std::string::npos;
  })) << cluster.worker(0).Stderr();
  EXPECT_TRUE(cluster.worker(0).Running());  // the worker keeps serving
}

TEST(ServicesTest, TwoTrainersClaimingOneRankAreRefusedWithADiagnosis) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  Child* first = cluster.StartTrainer(0, "dup", 0, 2, "hold");
  ASSERT_TRUE(WaitFor([&] { return Shared(*first); })) << first->Stdout() << first->Stderr();
  // Same rank through another worker (e.g. a launcher that gave every process RANK=0) ...
  Child* other_worker = cluster.StartTrainer(1, "dup", 0, 2, "hold");
  // ... and through the same worker.
  Child* same_worker = cluster.StartTrainer(0, "dup", 0, 2, "hold");
  ASSERT_TRUE(WaitFor([&] { return Result(*other_worker).first >= 0; }));
  ASSERT_TRUE(WaitFor([&] { return Result(*same_worker).first >= 0; }));
  EXPECT_EQ(Result(*other_worker).first, static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(Result(*other_worker).second, HasSubstr("rank 0 is already attached (host"));
  EXPECT_EQ(Result(*same_worker).first, static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(Result(*same_worker).second,
              HasSubstr(absl::StrCat("already connected to this worker (pid ", first->pid)));
  EXPECT_TRUE(first->Running());
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
  ASSERT_TRUE(WaitFor([&] { return Shared(*r1); })) << r1->Stdout() << r1->Stderr();
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

  // Rank 1's trainer dies too while no worker serves it: its segment is orphaned until a
  // worker on this host sweeps it (the next one to start does at once). Whether it still
  // exists right after the kill is not asserted: every worker on the host sweeps every 10 s,
  // those of tests running beside this one too (/dev/shm is shared), and one failed it so.
  std::string orphan = LineValue(r1->Stdout(), "segment");
  orphan = orphan.substr(0, orphan.find(' '));
  ASSERT_TRUE(SegmentExists(orphan)) << orphan;  // the trainer made it (alive until the kill)
  r1->Kill(SIGKILL);
  cluster.StartWorker(1);
  EXPECT_TRUE(WaitFor([&] { return !SegmentExists(orphan); })) << orphan;
}

TEST(ServicesTest, WorkerReRegistersAndReattachesItsRanksAfterTheCoordinatorRestarts) {
  Cluster cluster;
  const std::string lease = absl::StrCat("--lease_ms=", kLeaseMs);
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({lease}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "survivor", 0, 1, "hold");
  // Not merely the coordinator listing the job: its AttachRank may still be on the way back to
  // the worker, and a restart then fails the trainer's Hello instead of testing the re-attach.
  ASSERT_TRUE(WaitFor([&] { return Shared(*trainer); })) << trainer->Stdout() << trainer->Stderr();
  ASSERT_EQ(cluster.Status().jobs_size(), 1);
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({lease}));
  // The new coordinator knows nothing; the worker's next heartbeat is refused, it registers
  // again and re-attaches the rank of its live trainer.
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse s = cluster.Status();
    return LiveWorkers(s) == 1 && s.workers(0).info().pid() == cluster.worker(0).pid &&
           s.jobs_size() == 1 && s.jobs(0).ranks_size() == 1;
  })) << cluster.Status().DebugString()
      << "\nworker:\n"
      << cluster.worker(0).Stderr() << "\ncoordinator:\n"
      << cluster.coordinator().Stderr();
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
  ASSERT_TRUE(WaitFor([&] { return !cluster.coordinator().Running(); }, absl::Seconds(30)));
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
      cluster.RunCkptctl({"status", "--coordinator", "127.0.0.1:1", "--timeout", "300ms"}, &out),
      1);
  EXPECT_THAT(out, HasSubstr("GetStatus at coordinator 127.0.0.1:1"));
}

}  // namespace
}  // namespace ckpt::testing
