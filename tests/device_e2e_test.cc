// requires-gpu: trainers' CUDA tensors saved, loaded and resharded through real daemons, with
// two trainer processes (and two workers) sharing the one GPU through CUDA IPC. Skips, saying
// why, where no GPU exists. NOT YET RUN: written on a machine without a GPU; run with
// tools/gpu_suite.sh on one.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/gpu.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kLeaseMs = 1500;

#define SKIP_WITHOUT_GPU()                                                              \
  if (!CudaDeviceCount().ok()) {                                                        \
    GTEST_SKIP() << "requires a CUDA device: " << CudaDeviceCount().status().message(); \
  }

Child* StartDeviceTrainer(Cluster& cluster, int worker, const std::string& job, int rank, int world,
                          const std::string& mode, const std::string& path,
                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv =
      RankProgramArgs(cluster, "tests/device_trainer", worker, job, rank, world);
  for (const std::string& a : {std::string("--mode"), mode, std::string("--path"), path}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return cluster.Start(argv, absl::StrCat(job, "-r", rank));
}

// Runs `world` device trainers (rank r on worker r % workers) to completion.
std::vector<Child*> RunDeviceRanks(Cluster& cluster, const std::string& job, int world,
                                   const std::string& mode, const std::string& path,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<Child*> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(
        StartDeviceTrainer(cluster, r % cluster.num_workers(), job, r, world, mode, path, extra));
  }
  for (Child* t : ranks) {
    EXPECT_TRUE(WaitFor([&] { return Result(*t).first >= 0 || !t->Running(); }))
        << t->Stdout() << t->Stderr();
  }
  return ranks;
}

TEST(DeviceEndToEndTest, CudaTensorsSaveLoadAndReshardBitExactWithTwoTrainersOnOneGpu) {
  SKIP_WITHOUT_GPU();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0, {"--gpu=0"});
  cluster.StartWorker(1, {"--gpu=0"});
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("device_staging gpu=0"));
  const std::string path = cluster.dir() + "/dev";
  // Save: each trainer overwrites its tensors as soon as Save returns.
  for (Child* t : RunDeviceRanks(cluster, "dsave", 2, "save", path)) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stderr();
    EXPECT_THAT(t->Stdout(), HasSubstr("mutated"));
    // The state fits in the default pinned budget: Save returned before anything was written.
    EXPECT_THAT(t->Stdout(), HasSubstr("waited_for_writes=0 written_before=0"));
  }
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
  // Load on the same layout, direct and over the exchange (Gloo from host staging).
  for (const std::string algorithm : {"direct", "broadcast"}) {
    for (Child* t : RunDeviceRanks(cluster, "dload-" + algorithm, 2, "load", path,
                                   {"--algorithm", algorithm})) {
      EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << algorithm << t->Stdout() << t->Stderr();
    }
  }
  // A mixed state (host.c beside the device tensors) keeps the exchange on Gloo.
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("transport=\"gloo (host staging)\""));
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("has tensors in host memory (host.c)"));
  // Device-only ranks sharing the one GPU: NCCL refuses two ranks on one device, so Gloo too.
  for (Child* t : RunDeviceRanks(cluster, "dsave-device-only", 2, "save", path + "-d",
                                 {"--device_only", "1"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stderr();
  }
  for (Child* t : RunDeviceRanks(cluster, "dload-device-only", 2, "load", path + "-d",
                                 {"--algorithm", "broadcast", "--device_only", "1"})) {
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout() << t->Stderr();
  }
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("ranks 0 and 1 share GPU 0"));
  // Reshard on load: one rank takes the whole state.
  for (Child* t : RunDeviceRanks(cluster, "dreshard", 1, "load", path, {"--global_ranks", "2"})) {
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout() << t->Stderr();
  }
}

// Memory saves (mem://) of CUDA tensors: the client stages them through a host shadow (the
// tier holds host bytes), the trainer overwrites its tensors once Save returned, and loads put
// the saved values back into CUDA tensors, in the same layout and resharded. NOT YET RUN.
TEST(DeviceEndToEndTest, CudaTensorsSavedToMemoryLoadBackIntoCudaTensorsBitExact) {
  SKIP_WITHOUT_GPU();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--memory_replicas=0"}));
  cluster.StartWorker(0, {"--gpu=0"});
  cluster.StartWorker(1, {"--gpu=0"});
  for (Child* t : RunDeviceRanks(cluster, "msave", 2, "save", "mem://dev")) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stderr();
    EXPECT_THAT(t->Stdout(), HasSubstr("mutated"));
  }
  for (Child* t :
       RunDeviceRanks(cluster, "mload", 2, "load", "mem://dev", {"--algorithm", "broadcast"})) {
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout() << t->Stderr();
  }
  for (Child* t :
       RunDeviceRanks(cluster, "mreshard", 1, "load", "mem://dev", {"--global_ranks", "2"})) {
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout() << t->Stderr();
  }
}

// The device exchange: every rank device-resident on its own GPU with NCCL. One GPU allows one
// rank, so the NCCL communicator has N=1 (multi-rank exchanges are proven on Gloo).
TEST(DeviceEndToEndTest, AnAllDeviceLoadExchangesOverNcclOnTheDeviceBitExact) {
  SKIP_WITHOUT_GPU();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0, {"--gpu=0"});
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("nccl=yes"));
  const std::string path = cluster.dir() + "/nccl";
  for (Child* t : RunDeviceRanks(cluster, "nsave", 1, "save", path, {"--device_only", "1"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stderr();
  }
  for (const std::string algorithm : {"broadcast", "overlap_all_to_all"}) {
    for (Child* t : RunDeviceRanks(cluster, "nload-" + algorithm, 1, "load", path,
                                   {"--algorithm", algorithm, "--device_only", "1"})) {
      EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << algorithm << t->Stdout() << t->Stderr();
    }
  }
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("transport=\"nccl (device)\""));
  EXPECT_THAT(cluster.worker(0).Stderr(), Not(HasSubstr("transport=\"gloo")));
}

// 64 MiB of device state per rank through a 16 MiB pinned pool: the chunks stream into the data
// files while later ones are copied, Save returns once the last device byte left the device
// (after the earlier chunks were written, which the result says) and the trainer overwrites
// its tensors at once; the checkpoint still loads bit-exact.
TEST(DeviceEndToEndTest, AStateLargerThanThePinnedBudgetSavesBitExactAndSaysSaveWaitedForWrites) {
  SKIP_WITHOUT_GPU();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0, {"--gpu=0", "--pinned_staging_bytes=16777216"});
  cluster.StartWorker(1, {"--gpu=0", "--pinned_staging_bytes=16777216"});
  const std::string path = cluster.dir() + "/over-budget";
  const std::vector<std::string> big = {"--rows", "16", "--cols", "1048576"};
  for (Child* t : RunDeviceRanks(cluster, "obsave", 2, "save", path, big)) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << t->Stderr();
    EXPECT_THAT(t->Stdout(), HasSubstr("waited_for_writes=1"));
    EXPECT_THAT(t->Stdout(), HasSubstr("mutated"));
  }
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
  for (Child* t : RunDeviceRanks(cluster, "obload", 2, "load", path, big)) {
    EXPECT_THAT(t->Stdout(), HasSubstr("verified")) << t->Stdout() << t->Stderr();
  }
}

TEST(DeviceEndToEndTest, AWorkerKilledDuringADeviceSaveAbortsItAndCommitsNothing) {
  SKIP_WITHOUT_GPU();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  // A small pinned pool, so that staging 1 GiB per rank takes many round trips.
  cluster.StartWorker(0, {"--gpu=0", "--pinned_staging_bytes=16777216"});
  cluster.StartWorker(1, {"--gpu=0", "--pinned_staging_bytes=16777216"});
  const std::string path = cluster.dir() + "/killed";
  const std::vector<std::string> big = {"--rows", "256", "--cols", "1048576"};
  Child* r0 = StartDeviceTrainer(cluster, 0, "dkill", 0, 2, "save", path, big);
  Child* r1 = StartDeviceTrainer(cluster, 1, "dkill", 1, 2, "save", path, big);
  auto phase = [&] {
    pb::GetStatusResponse s = cluster.Status();
    return s.operations_size() > 0 ? s.operations(s.operations_size() - 1).phase()
                                   : pb::PHASE_UNSPECIFIED;
  };
  ASSERT_TRUE(WaitFor([&] { return phase() == pb::PHASE_EXECUTING; }))
      << r0->Stdout() << r0->Stderr();
  pid_t victim = cluster.worker(1).pid;
  cluster.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }))
      << r0->Stdout() << r1->Stdout();
  auto [code, message] = Result(*r0);
  EXPECT_NE(code, 0);
  EXPECT_THAT(message, HasSubstr(absl::StrCat("worker ", cluster.worker_id(1), " (pid ", victim)));
  EXPECT_NE(Result(*r1).first, 0);
  EXPECT_EQ(phase(), pb::PHASE_ABORTED);
  EXPECT_EQ(access(path.c_str(), F_OK), -1);  // never committed
}

TEST(DeviceEndToEndTest, AWorkerOnAMachineWithoutAGpuAdvertisesHostMemoryOnly) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; the no-GPU path cannot be seen";
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0);
  EXPECT_TRUE(
      WaitFor([&] { return cluster.worker(0).Stderr().find("no_gpu") != std::string::npos; }));
  pb::GetStatusResponse s = cluster.Status();
  const pb::WorkerStatus* w = FindWorker(s, cluster.worker_id(0));
  ASSERT_NE(w, nullptr);
  EXPECT_THAT(w->info().memory_kinds(), ::testing::ElementsAre(pb::MEMORY_HOST))
      << w->DebugString();
  EXPECT_EQ(w->info().gpu(), -1);
}

TEST(DeviceEndToEndTest, AWorkerAskedForAGpuItCannotServeRefusesToStart) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; the no-GPU path cannot be seen";
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  Child* w = cluster.Start({Runfile("worker/ckpt_worker"), "--coordinator=" + cluster.address(),
                            "--listen=unix:" + cluster.dir() + "/refused.sock", "--gpu=0"},
                           "refused-worker");
  ASSERT_TRUE(WaitFor([&] { return !w->Running(); })) << w->Stderr();
  EXPECT_TRUE(WIFEXITED(w->status) && WEXITSTATUS(w->status) == 2) << w->status;
  EXPECT_THAT(w->Stderr(), HasSubstr("--gpu 0 cannot be served: no CUDA device"));
}

}  // namespace
}  // namespace ckpt::testing
