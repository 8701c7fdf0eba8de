// Multi-process tests of exchange-based loads: real ckpt_coordinator and ckpt_worker processes
// on loopback, trainers loading through the client library. A checkpoint saved with
// TP=2 x DP=2 is loaded into TP=4 x DP=1, into an uneven 3-rank layout and into TP=2 x DP=2
// with each exchange algorithm; every trainer checks every element, and the coordinator's
// count of bytes read from storage shows each stored byte was read once (not once per replica).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

constexpr int kLeaseMs = 600;
constexpr int64_t kRows = 8;
constexpr int64_t kElements = 10000;                     // per row
constexpr int64_t kTensorBytes = kRows * kElements * 4;  // int32

// The finished load of `job` in the coordinator's status (bytes read from storage, or -1).
int64_t BytesReadByLoad(Cluster& cluster, const std::string& job) {
  pb::GetStatusResponse s = cluster.Status();
  for (const pb::OperationStatus& op : s.operations()) {
    if (op.job() == job && op.kind() == pb::OPERATION_LOAD && op.phase() == pb::PHASE_DONE) {
      return op.bytes_read();
    }
  }
  return -1;
}

// Saves probe.weight (8 x 10000 int32) from a TP=2 x DP=2 job into `path`.
void SaveTp2Dp2(Cluster& cluster, const std::string& path) {
  for (Child* t : RunRanks(cluster, "saver", 4, "save", path,
                           {"--layout", "tpdp", "--tp", "2", "--global_rows", absl::StrCat(kRows),
                            "--elements", absl::StrCat(kElements)})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
}

// Loads `path` as `world` ranks of `job` with `layout_args`, expecting every element verified.
void LoadAndVerify(Cluster& cluster, const std::string& job, int world, const std::string& path,
                   std::vector<std::string> args) {
  for (const std::string& a : {std::string("--global_rows"), absl::StrCat(kRows),
                               std::string("--elements"), absl::StrCat(kElements)}) {
    args.push_back(a);
  }
  for (Child* t : RunRanks(cluster, job, world, "load", path, args)) {
    EXPECT_EQ(Result(*t).first, 0) << job << ": " << Result(*t).second;
    EXPECT_THAT(t->Stdout(), ::testing::HasSubstr("verified ")) << job << ": " << t->Stdout();
  }
}

TEST(LoadExchangeTest, Tp2Dp2IntoTp4AndUnevenThreeRanksIsBitExactWithEachAlgorithm) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/tp2dp2";
  ASSERT_NO_FATAL_FAILURE(SaveTp2Dp2(cluster, path));
  for (const std::string algorithm : {"broadcast", "overlap_all_to_all"}) {
    // One wave with the default budget; several (units split mid-piece) with 64 KiB.
    for (const std::string budget : {"0", "65536"}) {
      const std::string tp4 = absl::StrCat("tp4-", algorithm, "-", budget);
      LoadAndVerify(cluster, tp4, 4, path,
                    {"--layout", "dtensor", "--algorithm", algorithm, "--budget", budget});
      EXPECT_EQ(BytesReadByLoad(cluster, tp4), kTensorBytes) << tp4;
      // Rows 0-2, 3-5, 6-7: the middle rank needs rows of both stored pieces.
      const std::string uneven = absl::StrCat("uneven-", algorithm, "-", budget);
      LoadAndVerify(cluster, uneven, 3, path,
                    {"--layout", "dtensor", "--algorithm", algorithm, "--budget", budget});
      EXPECT_EQ(BytesReadByLoad(cluster, uneven), kTensorBytes) << uneven;
    }
  }
}

TEST(LoadExchangeTest, EachStoredByteIsReadOnceWhenTheTargetReplicatesIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/tp2dp2";
  ASSERT_NO_FATAL_FAILURE(SaveTp2Dp2(cluster, path));
  // Into TP=2 x DP=2 again: both replicas need every row, but each row is read once.
  for (const std::string algorithm : {"broadcast", "overlap_all_to_all", "gather_rounds"}) {
    const std::string job = absl::StrCat("dp-", algorithm);
    LoadAndVerify(cluster, job, 4, path,
                  {"--layout", "tpdp", "--tp", "2", "--algorithm", algorithm});
    EXPECT_EQ(BytesReadByLoad(cluster, job), kTensorBytes) << job;
  }
  // Host state: the coordinator kept the exchange on Gloo, knowing where the tensors live
  // (the workers send each shard's memory kind with the join).
  EXPECT_THAT(cluster.worker(0).Stderr(),
              ::testing::HasSubstr("transport=\"gloo (host staging)\" transport_reason=\"rank 0 "
                                   "has tensors in host memory (probe.weight)\""));
  // The direct-read debugging path reads it once per replica: the count tells them apart.
  LoadAndVerify(cluster, "dp-direct", 4, path,
                {"--layout", "tpdp", "--tp", "2", "--algorithm", "direct"});
  EXPECT_EQ(BytesReadByLoad(cluster, "dp-direct"), 2 * kTensorBytes);
}

TEST(LoadExchangeTest, AnUnknownAlgorithmIsRefusedForEveryRankNamingTheValidOnes) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  for (int i = 0; i < 2; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/saved";
  for (Child* t : RunRanks(cluster, "saver", 2, "save", path, {"--layout", "dtensor"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  for (Child* t : RunRanks(cluster, "loader", 2, "load", path,
                           {"--layout", "dtensor", "--algorithm", "telepathy"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(Result(*t).second, ::testing::HasSubstr("unknown load algorithm 'telepathy'"));
    EXPECT_THAT(Result(*t).second, ::testing::HasSubstr("overlap_all_to_all"));
  }
}

}  // namespace
}  // namespace ckpt::testing
