#include "coordinator/memory_persist.h"

#include <string>
#include <vector>

#include "coordinator/memory_catalog.h"
#include "coordinator/memory_kinds.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt::coordinator {
namespace {

// A storage checkpoint of two tensors in two data files at `dir`/source, and the memory
// checkpoint "m" with the same manifest, file i held by worker w<i> and replicated on w<i+2>.
struct Fixture {
  std::vector<float> a = std::vector<float>(500, 1.5f);
  std::vector<float> b = std::vector<float>(700, -2.0f);
  std::string source;
  MemoryCheckpoint checkpoint;
};

Fixture MakeFixture(const std::string& dir) {
  Fixture f;
  for (size_t i = 0; i < f.a.size(); ++i) f.a[i] = static_cast<float>(i);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"a", DType::kF32, {500}}, TensorMeta{"b", DType::kF32, {700}}};
  for (int r = 0; r < 2; ++r) {
    DataFilePlan plan;
    plan.writer_rank = r;
    std::vector<float>& values = r == 0 ? f.a : f.b;
    plan.pieces.push_back(PieceData{r == 0 ? "a" : "b",
                                    Region{{0}, {static_cast<int64_t>(values.size())}, {}},
                                    values.data(), static_cast<int64_t>(values.size() * 4)});
    contents.files.push_back(plan);
  }
  f.source = JoinPath(dir, "source");
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(f.source, contents, WriteOptions());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  f.checkpoint.name = "m";
  f.checkpoint.manifest = *manifest;
  for (int i = 0; i < manifest->files_size(); ++i) {
    f.checkpoint.holders[manifest->files(i).name()] = {
        MemoryHolder{absl::StrCat("w", i), "hostA"},
        MemoryHolder{absl::StrCat("w", i + 2), "hostB"}};
  }
  return f;
}

// What a holder worker does: its files' bytes into the staging directory.
void WriteFiles(const Fixture& f, const std::string& staging,
                const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    absl::StatusOr<std::string> bytes = ReadWholeFile(JoinPath(f.source, file), 1 << 20);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(WriteFileDurably(JoinPath(staging, file), *bytes).ok());
  }
}

TEST(AssignPersistWritersTest, TheWritersWorkerFirstThenAnotherHolder) {
  Fixture f = MakeFixture(TestDir("persist_assign"));
  const std::string f0 = f.checkpoint.manifest.files(0).name();
  absl::StatusOr<PersistAssignment> first = AssignPersistWriters(f.checkpoint, {f0}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->at("w0"), std::vector<std::string>{f0});
  absl::StatusOr<PersistAssignment> second = AssignPersistWriters(f.checkpoint, {f0}, {"w0"});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->count("w2"), 1u);
  absl::StatusOr<PersistAssignment> none = AssignPersistWriters(f.checkpoint, {f0}, {"w0", "w2"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find(f0), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("worker w2 on host hostB (failed)"), std::string::npos);
}

TEST(MemoryPersistTest, CommitsTheSameCheckpointAsTheDirectSave) {
  const std::string dir = TestDir("persist_commit");
  Fixture f = MakeFixture(dir);
  const std::string path = JoinPath(dir, "persisted");
  absl::StatusOr<std::unique_ptr<MemoryPersist>> persist =
      MemoryPersist::Begin(f.checkpoint, path, /*overwrite=*/false);
  ASSERT_TRUE(persist.ok()) << persist.status();
  ASSERT_EQ((*persist)->pending().size(), 2u);
  EXPECT_EQ((*persist)->Commit().code(), absl::StatusCode::kFailedPrecondition);  // pending
  for (const auto& [worker, files] : PersistAssignment((*persist)->pending())) {
    WriteFiles(f, (*persist)->staging_dir(), files);
    ASSERT_TRUE((*persist)->Report(worker, files, absl::OkStatus()).ok());
  }
  ASSERT_TRUE((*persist)->AllWritten());
  EXPECT_TRUE((*persist)
                  ->Report("w0", {f.checkpoint.manifest.files(0).name()},
                           absl::InternalError("late"))
                  ->empty());  // a late report after the file was written changes nothing
  ASSERT_TRUE((*persist)->Commit().ok());
  for (const pb::DataFile& file : f.checkpoint.manifest.files()) {
    EXPECT_EQ(*ReadWholeFile(JoinPath(path, file.name()), 1 << 20),
              *ReadWholeFile(JoinPath(f.source, file.name()), 1 << 20));
  }
  EXPECT_EQ(*ReadWholeFile(JoinPath(path, "manifest.pb"), 1 << 20),
            *ReadWholeFile(JoinPath(f.source, "manifest.pb"), 1 << 20));
}

TEST(MemoryPersistTest, AFailedHolderIsReplacedByAnotherHolderOfTheSameFile) {
  const std::string dir = TestDir("persist_failover");
  Fixture f = MakeFixture(dir);
  const std::string path = JoinPath(dir, "persisted");
  auto persist = MemoryPersist::Begin(f.checkpoint, path, false);
  ASSERT_TRUE(persist.ok()) << persist.status();
  const std::vector<std::string> files_of_w0 = (*persist)->pending().at("w0");
  absl::StatusOr<PersistAssignment> again =
      (*persist)->WorkerFailed("w0", absl::UnavailableError("lease of w0 expired"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->at("w2"), files_of_w0);
  for (const auto& [worker, files] : PersistAssignment((*persist)->pending())) {
    WriteFiles(f, (*persist)->staging_dir(), files);
    ASSERT_TRUE((*persist)->Report(worker, files, absl::OkStatus()).ok());
  }
  ASSERT_TRUE((*persist)->Commit().ok());
  EXPECT_TRUE(PathExists(JoinPath(path, "manifest.pb")));
  EXPECT_EQ(*ReadWholeFile(JoinPath(path, files_of_w0[0]), 1 << 20),
            *ReadWholeFile(JoinPath(f.source, files_of_w0[0]), 1 << 20));
}

TEST(MemoryPersistTest, ASuccessReportCoversOnlyTheFilesItNames) {
  const std::string dir = TestDir("persist_partial_report");
  Fixture f = MakeFixture(dir);
  auto persist = MemoryPersist::Begin(f.checkpoint, JoinPath(dir, "persisted"), false);
  ASSERT_TRUE(persist.ok()) << persist.status();
  const std::string f0 = f.checkpoint.manifest.files(0).name();
  const std::string f1 = f.checkpoint.manifest.files(1).name();
  // w0 fails: f0 goes to w2; then w1 fails: f1 goes to w3. w2 reports f0 only.
  ASSERT_TRUE((*persist)->Report("w0", {f0}, absl::UnavailableError("killed")).ok());
  ASSERT_TRUE((*persist)->Report("w2", {}, absl::OkStatus()).ok());
  EXPECT_FALSE((*persist)->AllWritten());
  EXPECT_EQ((*persist)->pending().at("w2"), std::vector<std::string>{f0});
  ASSERT_TRUE((*persist)->Report("w2", {f0}, absl::OkStatus()).ok());
  EXPECT_EQ((*persist)->pending().count("w2"), 0u);
  EXPECT_EQ((*persist)->pending().at("w1"), std::vector<std::string>{f1});
  EXPECT_EQ((*persist)->Commit().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MemoryPersistTest, NoHolderLeftFailsNamingFileAndWorkersAndCommitsNothing) {
  const std::string dir = TestDir("persist_no_holder");
  Fixture f = MakeFixture(dir);
  const std::string path = JoinPath(dir, "persisted");
  auto persist = MemoryPersist::Begin(f.checkpoint, path, false);
  ASSERT_TRUE(persist.ok()) << persist.status();
  const std::string staging = (*persist)->staging_dir();
  const std::vector<std::string> files_of_w0 = (*persist)->pending().at("w0");
  ASSERT_TRUE((*persist)->Report("w0", files_of_w0, absl::UnavailableError("killed")).ok());
  absl::StatusOr<PersistAssignment> none =
      (*persist)->Report("w2", files_of_w0, absl::InternalError("disk full"));
  ASSERT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(none.status().message());
  EXPECT_NE(message.find(f.checkpoint.manifest.files(0).name()), std::string::npos) << message;
  EXPECT_NE(message.find("w0: killed"), std::string::npos) << message;
  EXPECT_NE(message.find("w2: disk full"), std::string::npos) << message;
  ASSERT_TRUE((*persist)->Abort().ok());
  EXPECT_FALSE(PathExists(path));
  EXPECT_FALSE(PathExists(staging));
}

TEST(MemoryPersistTest, AnExistingCheckpointIsRefusedWithoutOverwriteAndLeftIntact) {
  const std::string dir = TestDir("persist_existing");
  Fixture f = MakeFixture(dir);
  const std::string before = *ReadWholeFile(JoinPath(f.source, "manifest.pb"), 1 << 20);
  auto refused = MemoryPersist::Begin(f.checkpoint, f.source, /*overwrite=*/false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(refused.status().message().find("mem://m"), std::string::npos) << refused.status();
  EXPECT_EQ(*ReadWholeFile(JoinPath(f.source, "manifest.pb"), 1 << 20), before);
  // A directory that is not a checkpoint is never replaced, even when overwriting.
  const std::string other = JoinPath(dir, "not_a_checkpoint");
  ASSERT_TRUE(MakeDir(other).ok());  // not empty: an empty directory is committed over
  ASSERT_TRUE(WriteFileDurably(JoinPath(other, "notes.txt"), "keep").ok());
  EXPECT_EQ(MemoryPersist::Begin(f.checkpoint, other, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MemoryCatalogPersistTest, ANewSaveThatWouldEvictAPersistingCheckpointIsRefused) {
  MemoryCatalog catalog;
  MemoryCheckpoint old;
  old.name = "old";
  old.persist_to = "/ckpt/old";
  old.persist_state = PersistState::kPersisting;
  ASSERT_TRUE(catalog.Claim("old", "op-1").ok());
  ASSERT_TRUE(catalog.Commit("op-1", old, /*keep_newest=*/1).ok());
  absl::Status refused = catalog.CheckRoomForOneMore(1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("mem://old"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("/ckpt/old"), std::string::npos) << refused;
  EXPECT_TRUE(catalog.CheckRoomForOneMore(2).ok());
  // Even a commit that raced past the check keeps it until it is persisted.
  MemoryCheckpoint next;
  next.name = "next";
  ASSERT_TRUE(catalog.Claim("next", "op-2").ok());
  EXPECT_TRUE(catalog.Commit("op-2", next, 1)->empty());
  EXPECT_TRUE(catalog.Find("old").ok());
  absl::StatusOr<std::vector<std::string>> forgotten =
      catalog.SetPersistState("old", PersistState::kPersisted, "", 1);
  ASSERT_TRUE(forgotten.ok());
  EXPECT_EQ(*forgotten, std::vector<std::string>{"old"});
  EXPECT_TRUE(catalog.CheckRoomForOneMore(1).ok());
}

TEST(MemoryCatalogPersistTest, AMemorySaveIsRefusedWhileKeepNewestWouldEvictAPersistingOne) {
  MemoryCatalog catalog;
  MemoryCheckpoint old;
  old.name = "old";
  old.persist_to = "/ckpt/old";
  old.persist_state = PersistState::kPersisting;
  ASSERT_TRUE(catalog.Claim("old", "op-1").ok());
  ASSERT_TRUE(catalog.Commit("op-1", old).ok());
  MemorySaveKind kind(&catalog, /*replicas=*/0, /*keep_newest=*/1);
  Operation op;
  op.id = "op-2";
  op.path = "mem://next";
  op.world_size = 1;
  op.ranks.resize(1);
  absl::StatusOr<std::vector<RankPlan>> refused = kind.Plan(op);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("/ckpt/old"), std::string::npos) << refused.status();
  EXPECT_TRUE(catalog.Claim("next", "op-3").ok());  // the refused save claimed nothing
}

TEST(MemoryCatalogPersistTest, StatusSaysHowThePersistenceStands) {
  MemoryCatalog catalog;
  MemoryCheckpoint m;
  m.name = "m";
  m.persist_to = "/ckpt/m";
  m.persist_state = PersistState::kPersisting;
  ASSERT_TRUE(catalog.Claim("m", "op").ok());
  ASSERT_TRUE(catalog.Commit("op", m).ok());
  google::protobuf::RepeatedPtrField<pb::MemoryCheckpointStatus> status;
  catalog.ToProto(&status);
  EXPECT_EQ(status[0].persist(), "persisting to /ckpt/m");
  ASSERT_TRUE(catalog.SetPersistState("m", PersistState::kFailed, "no copy left").ok());
  status.Clear();
  catalog.ToProto(&status);
  EXPECT_EQ(status[0].persist(), "persist to /ckpt/m failed: no copy left");
  EXPECT_EQ(catalog.SetPersistState("x", PersistState::kPersisted, "").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::coordinator
