#include "coordinator/persist_driver.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt::coordinator {
namespace {

// A storage checkpoint of two data files at `dir`/source, and memory checkpoint "m" with the
// same manifest committed in `catalog` (persisting to `path`): file i held by w<i> and w<i+2>.
std::string MakeCommitted(const std::string& dir, MemoryCatalog* catalog, const std::string& path) {
  CheckpointContents contents;
  std::vector<float> a(300, 1.0f), b(400, 2.0f);
  contents.tensors = {TensorMeta{"a", DType::kF32, {300}}, TensorMeta{"b", DType::kF32, {400}}};
  for (int r = 0; r < 2; ++r) {
    DataFilePlan plan;
    plan.writer_rank = r;
    std::vector<float>& v = r == 0 ? a : b;
    plan.pieces.push_back(PieceData{r == 0 ? "a" : "b",
                                    Region{{0}, {static_cast<int64_t>(v.size())}, {}}, v.data(),
                                    static_cast<int64_t>(v.size() * 4)});
    contents.files.push_back(plan);
  }
  const std::string source = JoinPath(dir, "source");
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(source, contents, WriteOptions());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  MemoryCheckpoint checkpoint;
  checkpoint.name = "m";
  checkpoint.manifest = *manifest;
  for (int i = 0; i < manifest->files_size(); ++i) {
    checkpoint.holders[manifest->files(i).name()] = {
        MemoryHolder{absl::StrCat("w", i), "hostA"},
        MemoryHolder{absl::StrCat("w", i + 2), "hostB"}};
  }
  checkpoint.persist_to = path;
  checkpoint.persist_state = PersistState::kPersisting;
  EXPECT_TRUE(catalog->Claim("m", "op").ok());
  EXPECT_TRUE(catalog->Commit("op", checkpoint).ok());
  return source;
}

// Memory checkpoint "m" committed in `catalog` (MakeCommitted, under TestDir(`name`)) and a
// driver persisting it to <dir>/persisted, queued.
struct Persisting {
  Persisting(const std::string& name, int keep_newest, const std::string& incarnation = "")
      : dir(TestDir(name)),
        path(JoinPath(dir, "persisted")),
        source(MakeCommitted(dir, &catalog, path)),
        driver(&catalog, keep_newest, incarnation) {
    driver.Enqueue({"m", path, false});
  }
  const std::string dir;
  MemoryCatalog catalog;
  const std::string path;
  const std::string source;
  PersistDriver driver;
};

// What a worker does with its PersistWork items: copies its files (from the source checkpoint,
// byte-identical to what it holds) into the staging directory and builds the report.
std::vector<pb::PersistReportRequest> Execute(PersistDriver& driver, const std::string& worker,
                                              const std::string& source,
                                              std::set<std::string>* sent) {
  std::vector<pb::PersistReportRequest> reports;
  for (const PersistItem& item : driver.ItemsFor(worker, *sent)) {
    sent->insert(item.key);
    if (!item.item.has_persist()) continue;
    const pb::PersistWork& work = item.item.persist();
    for (const std::string& file : work.files()) {
      absl::StatusOr<std::string> bytes = ReadWholeFile(JoinPath(source, file), 1 << 20);
      EXPECT_TRUE(bytes.ok());
      EXPECT_TRUE(WriteFileDurably(JoinPath(work.staging_dir(), file), *bytes).ok());
    }
    pb::PersistReportRequest report;
    report.set_worker_id(worker);
    report.set_persist_id(work.persist_id());
    report.mutable_files()->CopyFrom(work.files());
    reports.push_back(report);
  }
  return reports;
}

std::string PersistOf(const MemoryCatalog& catalog) {
  google::protobuf::RepeatedPtrField<pb::MemoryCheckpointStatus> out;
  catalog.ToProto(&out);
  return out.empty() ? "" : out[0].persist();
}

TEST(PersistDriverTest, WorkersWriteTheirFilesAndTheCheckpointCommitsThenHoldersUnpin) {
  Persisting f("driver_commit", 1);
  ASSERT_TRUE(f.driver.HasSteps());
  f.driver.RunSteps();  // staging directory made, work assigned to the writers w0 and w1
  std::set<std::string> sent0, sent1;
  std::vector<pb::PersistReportRequest> r0 = Execute(f.driver, "w0", f.source, &sent0);
  std::vector<pb::PersistReportRequest> r1 = Execute(f.driver, "w1", f.source, &sent1);
  ASSERT_EQ(r0.size(), 1u);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_FALSE(f.driver.Report("w0", r0[0]));  // one file left: nothing to run yet
  EXPECT_EQ(PersistOf(f.catalog), "persisting to " + f.path);
  EXPECT_TRUE(f.driver.Report("w1", r1[0]));
  f.driver.RunSteps();  // commits
  EXPECT_EQ(PersistOf(f.catalog), "persisted to " + f.path);
  EXPECT_TRUE(CheckpointReader::Open(f.path).ok());
  EXPECT_EQ(f.driver.in_flight(), 0u);
  // Every holder is told to unpin.
  for (const std::string w : {"w0", "w1", "w2", "w3"}) {
    std::vector<PersistItem> items = f.driver.ItemsFor(w, {});
    ASSERT_EQ(items.size(), 1u) << w;
    EXPECT_EQ(items[0].item.persist_ended().name(), "m");
  }
}

TEST(PersistDriverTest, ALostWritersFilesGoToAnotherHolder) {
  Persisting f("driver_failover", 0);
  f.driver.RunSteps();
  std::set<std::string> sent1;
  for (const auto& r : Execute(f.driver, "w1", f.source, &sent1)) f.driver.Report("w1", r);
  // w0 dies before writing: its file moves to w2, the other holder.
  EXPECT_TRUE(f.driver.WorkerFailed("w0", absl::UnavailableError("lease expired")));
  EXPECT_TRUE(f.driver.ItemsFor("w0", {}).empty());
  std::set<std::string> sent2;
  std::vector<pb::PersistReportRequest> r2 = Execute(f.driver, "w2", f.source, &sent2);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_TRUE(f.driver.Report("w2", r2[0]));
  f.driver.RunSteps();
  EXPECT_EQ(PersistOf(f.catalog), "persisted to " + f.path);
}

TEST(PersistDriverTest, AWorkerLostWhileTheStagingDirectoryIsMadeGetsNoWork) {
  Persisting f("driver_lost_early", 0);
  // Lost before the flight began (the catalog here still lists it as a holder).
  EXPECT_FALSE(f.driver.WorkerFailed("w0", absl::UnavailableError("lease expired")));
  f.driver.RunSteps();
  EXPECT_TRUE(f.driver.ItemsFor("w0", {}).empty());
  std::set<std::string> sent1, sent2;
  for (const auto& r : Execute(f.driver, "w1", f.source, &sent1)) f.driver.Report("w1", r);
  std::vector<pb::PersistReportRequest> r2 = Execute(f.driver, "w2", f.source, &sent2);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_TRUE(f.driver.Report("w2", r2[0]));
  f.driver.RunSteps();
  EXPECT_EQ(PersistOf(f.catalog), "persisted to " + f.path);
}

TEST(PersistDriverTest, AFailedWriteMovesTheFileAndALateReportIsIgnored) {
  Persisting f("driver_write_failed", 0);
  f.driver.RunSteps();
  std::vector<PersistItem> w0 = f.driver.ItemsFor("w0", {});
  ASSERT_EQ(w0.size(), 1u);
  pb::PersistReportRequest failed;
  failed.set_worker_id("w0");
  failed.set_persist_id(w0[0].item.persist().persist_id());
  failed.mutable_files()->CopyFrom(w0[0].item.persist().files());
  failed.mutable_result()->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  failed.mutable_result()->set_message("checksum mismatch");
  EXPECT_TRUE(f.driver.Report("w0", failed));   // the file moves to w2
  EXPECT_FALSE(f.driver.Report("w0", failed));  // again: nothing pending there any more
  std::set<std::string> sent1, sent2;
  for (const auto& r : Execute(f.driver, "w1", f.source, &sent1)) f.driver.Report("w1", r);
  for (const auto& r : Execute(f.driver, "w2", f.source, &sent2)) f.driver.Report("w2", r);
  f.driver.RunSteps();
  EXPECT_EQ(PersistOf(f.catalog), "persisted to " + f.path);
}

TEST(PersistDriverTest, NoHolderLeftFailsNamingTheFileAndLeavesNothingAtThePath) {
  Persisting f("driver_orphan", 0);
  f.driver.RunSteps();
  EXPECT_TRUE(f.driver.WorkerFailed("w0", absl::UnavailableError("lease expired")));
  EXPECT_TRUE(f.driver.WorkerFailed("w2", absl::UnavailableError("lease expired")));
  f.driver.RunSteps();  // discards the staging directory
  const std::string persist = PersistOf(f.catalog);
  EXPECT_EQ(persist.rfind("persist to " + f.path + " failed: ", 0), 0u) << persist;
  EXPECT_NE(persist.find("data/r0_0.safetensors"), std::string::npos) << persist;
  EXPECT_NE(persist.find("w2"), std::string::npos) << persist;
  EXPECT_FALSE(PathExists(f.path));
  absl::StatusOr<std::vector<std::string>> left = ListDir(f.dir);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, std::vector<std::string>{"source"});  // no staging directory remains
}

TEST(PersistDriverTest, ARecoveredPersistenceTheLastProcessCommittedIsNotWrittenAgain) {
  const std::string dir = TestDir("driver_recovered");
  MemoryCatalog catalog;
  // The previous coordinator process committed "m" at `source` before it was killed.
  const std::string source = MakeCommitted(dir, &catalog, JoinPath(dir, "source"));
  const std::string before = *ReadWholeFile(JoinPath(source, "manifest.pb"), 1 << 20);
  PersistDriver driver(&catalog, 2, "00000000000000ab");
  driver.Enqueue({"m", source, /*overwrite=*/false, /*recovered=*/true});
  std::vector<std::string> lines = driver.RunSteps();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("committed before the coordinator restarted"), std::string::npos)
      << lines[0];
  EXPECT_EQ(PersistOf(catalog), "persisted to " + source);
  EXPECT_EQ(driver.in_flight(), 0u);
  // Every holder is told to unpin; nobody is asked to write.
  for (const char* worker : {"w0", "w1", "w2", "w3"}) {
    std::vector<PersistItem> items = driver.ItemsFor(worker, {});
    ASSERT_EQ(items.size(), 1u) << worker;
    EXPECT_TRUE(items[0].item.has_persist_ended()) << worker;
  }
  EXPECT_EQ(*ReadWholeFile(JoinPath(source, "manifest.pb"), 1 << 20), before);
}

TEST(PersistDriverTest, ARecoveredPersistenceOntoAnotherCheckpointFailsAndLeavesItIntact) {
  const std::string dir = TestDir("driver_recovered_other");
  MemoryCatalog catalog;
  const std::string source = MakeCommitted(dir, &catalog, JoinPath(dir, "target"));
  // Something else is committed at the target: an earlier checkpoint (here: "m"'s data, but
  // another manifest), which a persistence without overwrite must leave alone.
  const std::string target = JoinPath(dir, "target");
  CheckpointContents other;
  std::vector<float> c(10, 3.0f);
  other.tensors = {TensorMeta{"c", DType::kF32, {10}}};
  DataFilePlan plan;
  plan.pieces.push_back(PieceData{"c", Region{{0}, {10}, {}}, c.data(), 40});
  other.files.push_back(plan);
  ASSERT_TRUE(WriteCheckpoint(target, other, WriteOptions()).ok());
  const std::string before = *ReadWholeFile(JoinPath(target, "manifest.pb"), 1 << 20);
  PersistDriver driver(&catalog, 2, "00000000000000ab");
  driver.Enqueue({"m", target, /*overwrite=*/false, /*recovered=*/true});
  std::vector<std::string> lines = driver.RunSteps();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("persist_failed", 0), 0u) << lines[0];
  EXPECT_EQ(PersistOf(catalog).rfind("persist to " + target + " failed", 0), 0u)
      << PersistOf(catalog);
  EXPECT_EQ(*ReadWholeFile(JoinPath(target, "manifest.pb"), 1 << 20), before);
  (void)source;
}

TEST(PersistDriverTest, PersistenceIdsCarryTheCoordinatorsIncarnation) {
  Persisting f("driver_ids", 2, "00000000000000ab");
  f.driver.RunSteps();
  std::vector<PersistItem> items = f.driver.ItemsFor("w0", {});
  ASSERT_FALSE(items.empty());
  EXPECT_EQ(items[0].item.persist().persist_id().rfind("persist-00000000000000ab-", 0), 0u)
      << items[0].item.persist().persist_id();
  // A report of the previous process's item with the same number is not taken for this one's.
  pb::PersistReportRequest stale;
  stale.set_worker_id("w0");
  stale.set_persist_id("persist-0/0");
  stale.add_files(items[0].item.persist().files(0));
  EXPECT_FALSE(f.driver.Report("w0", stale));
}

}  // namespace
}  // namespace ckpt::coordinator
