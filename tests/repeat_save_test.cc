// Issue 16, end to end: a repeat save of an unchanged layout skips the metadata gather. Real
// ckpt_coordinator and ckpt_worker processes on loopback; trainer processes save through the
// client library. The second save of the same session sends only each rank's description
// digest (visible in the coordinator's status and log); both checkpoints are bit-exact. When
// the coordinator no longer keeps a description the worker re-sends it transparently, and a
// changed layout saves correctly.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr int64_t kElements = 1024;

// The status entry of the operation that saved `path` (fails the test when there is none).
pb::OperationStatus OperationOf(Cluster& cluster, const std::string& path) {
  pb::GetStatusResponse status = cluster.Status();
  for (const pb::OperationStatus& op : status.operations()) {
    if (op.path() == path) return op;
  }
  ADD_FAILURE() << "no operation saved " << path;
  return pb::OperationStatus();
}

// Every element of `path`'s probe.weight holds its global flat index (what the trainers held,
// whatever their layout).
void ExpectBitExact(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> values(kWorld * kElements, -1);
  ASSERT_TRUE(
      (*reader)->ReadRegion("probe.weight", WholeRegion({kWorld, kElements}), values.data()).ok());
  for (int64_t i = 0; i < kWorld * kElements; ++i) {
    ASSERT_EQ(values[i], static_cast<int32_t>(i)) << path << " element " << i;
  }
}

void ExpectSaved(const std::vector<Child*>& ranks) {
  for (Child* t : ranks) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << "\n" << t->Stderr();
  }
}

TEST(RepeatSaveTest, TheRepeatSaveSkipsTheGatherAndAChangedLayoutStillSaves) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=600"}));
  for (int w = 0; w < kWorld; ++w) cluster.StartWorker(w);
  const std::string first = cluster.dir() + "/first", second = cluster.dir() + "/second";

  // One session saves twice: the second join of each rank carries only its digest.
  std::vector<Child*> ranks =
      RunRanks(cluster, "rep", kWorld, "save", first,
               {"--elements", absl::StrCat(kElements), "--then_save", second});
  ExpectSaved(ranks);
  for (Child* t : ranks) EXPECT_EQ(LineValue(t->Stdout(), "first_saved"), "0 ") << t->Stdout();
  const pb::OperationStatus gathered = OperationOf(cluster, first);
  const pb::OperationStatus repeated = OperationOf(cluster, second);
  EXPECT_EQ(gathered.phase(), pb::PHASE_DONE);
  EXPECT_EQ(gathered.ranks_described_by_digest(), 0);
  EXPECT_EQ(repeated.phase(), pb::PHASE_DONE);
  EXPECT_EQ(repeated.ranks_described_by_digest(), kWorld) << ClusterLogs(cluster);
  EXPECT_EQ(repeated.bytes_done(), kWorld * kElements * 4);
  EXPECT_THAT(cluster.coordinator().Stderr(),
              HasSubstr(absl::StrCat("path=", second, " ranks=2 by_digest=2")));
  ASSERT_NO_FATAL_FAILURE(ExpectBitExact(first));
  ASSERT_NO_FATAL_FAILURE(ExpectBitExact(second));
  // Each worker learned both saves' ends from its work stream, and its trainers' waits made
  // at most one WaitOperation call each per save, for the status at their snapshot (they
  // polled the coordinator every 100 ms until it before streams brought the ends).
  for (int w = 0; w < kWorld; ++w) {
    const pb::WorkerStatusResponse worker = WorkerStatus(cluster, w);
    EXPECT_EQ(worker.ends_from_stream(), 2) << worker.DebugString();
    EXPECT_LE(worker.coordinator_wait_calls(), 2) << worker.DebugString();
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", second}, &out), 0) << out;

  // The trainers left, so the job ended and the coordinator dropped its descriptions; the
  // workers still know the digests and send them alone: refused, then sent in full, unseen by
  // the trainers.
  const std::string third = cluster.dir() + "/third";
  ExpectSaved(
      RunRanks(cluster, "rep", kWorld, "save", third, {"--elements", absl::StrCat(kElements)}));
  EXPECT_EQ(OperationOf(cluster, third).ranks_described_by_digest(), 0);
  EXPECT_THAT(cluster.worker(0).Stderr(), HasSubstr("join_sends_full_state job=rep rank=0"));
  ASSERT_NO_FATAL_FAILURE(ExpectBitExact(third));

  // A changed layout (column blocks instead of rows) is described in full and saves correctly.
  const std::string fourth = cluster.dir() + "/fourth";
  ExpectSaved(RunRanks(cluster, "rep", kWorld, "save", fourth,
                       {"--elements", absl::StrCat(kElements), "--layout", "cols"}));
  EXPECT_EQ(OperationOf(cluster, fourth).ranks_described_by_digest(), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectBitExact(fourth));
}

}  // namespace
}  // namespace ckpt::testing
