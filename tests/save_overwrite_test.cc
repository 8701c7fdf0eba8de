// Multi-process tests of saves that replace a committed checkpoint (SaveOptions::overwrite,
// `ckptctl save --overwrite`; issue 41): real ckpt_coordinator and ckpt_worker processes on
// loopback, trainer_probe ranks saving through the client library. The new checkpoint is read
// back bit-exact and verified; without overwrite, or with it over anything but a committed
// checkpoint, the save is refused and what is there stays; an overwriting save that fails after
// the coordinator made its staging directory leaves the old checkpoint intact and no leftovers.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// No worker dies here: a lease of seconds (a loaded 2-core machine runs these).
const char kLease[] = "--lease_ms=5000";

// Checks that `path` is a committed checkpoint whose probe.weight has `rows` x `elements`
// elements, each its global flat index (what trainer_probe saves), and passes ckptctl verify.
void ExpectCheckpointHolds(Cluster& cluster, const std::string& path, int64_t rows,
                           int64_t elements) {
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const pb::TensorMeta* meta = (*reader)->FindTensor("probe.weight");
  ASSERT_NE(meta, nullptr);
  ASSERT_EQ(meta->global_shape_size(), 2);
  EXPECT_EQ(meta->global_shape(0), rows);
  EXPECT_EQ(meta->global_shape(1), elements);
  std::vector<int32_t> values(rows * elements, -1);
  ASSERT_TRUE(
      (*reader)->ReadRegion("probe.weight", WholeRegion({rows, elements}), values.data()).ok());
  for (int64_t i = 0; i < rows * elements; ++i) {
    ASSERT_EQ(values[i], static_cast<int32_t>(i)) << path << " element " << i;
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
}

// Entries of `dir` whose names start with "." (staging and swapped-out directories are hidden
// siblings of the checkpoint: ".<name>.tmp-...", ".<name>.discard-...").
std::vector<std::string> HiddenEntries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && name[0] == '.') names.push_back(name);
  }
  closedir(d);
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SaveOverwriteTest, OverwriteReplacesACommittedCheckpointBitExactAndOnlyWithTheOption) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({kLease}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/step";
  for (Child* t : RunRanks(cluster, "ow", 2, "save", path, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 2, 1024));
  // Without overwrite: refused for every rank, the old checkpoint stays.
  for (Child* t : RunRanks(cluster, "ow", 2, "save", path, {"--elements", "2048"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kAlreadyExists))
        << Result(*t).second;
    EXPECT_THAT(Result(*t).second, HasSubstr(path));
  }
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 2, 1024));
  // With it (asked by one rank): the new checkpoint, another shape, replaces the old one.
  Child* r0 =
      cluster.StartTrainer(0, "ow", 0, 2, "save", path, {"--elements", "2048", "--overwrite", "1"});
  Child* r1 = cluster.StartTrainer(1, "ow", 1, 2, "save", path, {"--elements", "2048"});
  ASSERT_TRUE(WaitFor([&] { return Finished(*r0) && Finished(*r1); })) << ClusterLogs(cluster);
  ASSERT_EQ(Result(*r0).first, 0) << Result(*r0).second;
  ASSERT_EQ(Result(*r1).first, 0) << Result(*r1).second;
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 2, 2048));
  EXPECT_THAT(HiddenEntries(cluster.dir()), ::testing::IsEmpty());  // the old one is removed
}

TEST(SaveOverwriteTest, OverwriteRefusesADirectoryThatIsNotACheckpointNamingItAndKeepsIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({kLease}));
  cluster.StartWorker(0);
  const std::string path = cluster.dir() + "/notes";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  std::ofstream(path + "/notes.txt") << "keep me\n";
  std::vector<Child*> ranks = RunRanks(cluster, "notes", 1, "save", path, {"--overwrite", "1"});
  EXPECT_EQ(Result(*ranks[0]).first, static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << Result(*ranks[0]).second;
  EXPECT_THAT(Result(*ranks[0]).second, HasSubstr(path));
  EXPECT_THAT(Result(*ranks[0]).second, HasSubstr("not a ckpt checkpoint"));
  EXPECT_EQ(ReadFile(path + "/notes.txt"), "keep me\n");
  EXPECT_THAT(HiddenEntries(cluster.dir()), ::testing::IsEmpty());
}

// The ranks disagree on the tensor's shape, which the planner refuses: after Prepare made the
// staging directory next to the old checkpoint (with overwrite it accepted the checkpoint
// there), so the save ends by discarding it, and the old checkpoint must come through intact.
TEST(SaveOverwriteTest, AnOverwritingSaveThatFailsAfterStagingLeavesTheOldCheckpointIntact) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({kLease}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/kept";
  for (Child* t : RunRanks(cluster, "kept", 2, "save", path, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  Child* r0 = cluster.StartTrainer(0, "kept", 0, 2, "save", path,
                                   {"--elements", "2048", "--overwrite", "1"});
  Child* r1 = cluster.StartTrainer(1, "kept", 1, 2, "save", path,
                                   {"--elements", "512", "--overwrite", "1"});
  ASSERT_TRUE(WaitFor([&] { return Finished(*r0) && Finished(*r1); })) << ClusterLogs(cluster);
  EXPECT_NE(Result(*r0).first, 0);
  EXPECT_EQ(Result(*r0).second, Result(*r1).second);
  // Refused by the planner, not at the path (which overwrite let through).
  EXPECT_THAT(Result(*r0).second, HasSubstr("planning failed"));
  EXPECT_THAT(Result(*r0).second, Not(HasSubstr("exists")));
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 2, 1024));
  EXPECT_THAT(HiddenEntries(cluster.dir()), ::testing::IsEmpty());
}

TEST(SaveOverwriteTest, CkptctlSaveOverwriteReplacesTheCheckpointAtTheTrainersNextPoll) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({kLease}));
  cluster.StartWorker(0);
  const std::string path = cluster.dir() + "/operator";
  for (Child* t : RunRanks(cluster, "polled", 1, "save", path, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  auto ckptctl_save = [&](bool overwrite, std::string* out) {
    Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll", "", {"--elements", "2048"});
    std::vector<std::string> args = {
        "save", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "60s"};
    if (overwrite) args.push_back("--overwrite");
    args.push_back(path);
    EXPECT_TRUE(WaitFor([&] { return Shared(*trainer); })) << ClusterLogs(cluster);
    const int code = cluster.RunCkptctl(args, out);
    EXPECT_TRUE(WaitFor([&] { return Finished(*trainer); })) << ClusterLogs(cluster);
    return code;
  };
  std::string out;
  EXPECT_NE(ckptctl_save(false, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(path));
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 1, 1024));
  ASSERT_EQ(ckptctl_save(true, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("committed at " + path));
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, path, 1, 2048));
}

}  // namespace
}  // namespace ckpt::testing
