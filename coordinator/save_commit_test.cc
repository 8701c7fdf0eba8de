#include "coordinator/save_commit.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

pb::PieceMeta Row(int rank) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key("w");
  s.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  s.mutable_tensor()->add_global_shape(2);
  s.mutable_tensor()->add_global_shape(4);
  s.mutable_region()->add_offsets(rank);
  s.mutable_region()->add_offsets(0);
  s.mutable_region()->add_lengths(1);
  s.mutable_region()->add_lengths(4);
  return s;
}

std::string TmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid());
}

Operation TwoRankSave(const std::string& path) {
  Operation op;
  op.id = "op-7";
  op.job = "j";
  op.kind = OperationKind::kSave;
  op.path = path;
  op.world_size = 2;
  op.ranks.resize(2);
  op.metadata = {{"step", "42"}, {"run", "a"}};
  for (int r = 0; r < 2; ++r) op.ranks[r].shards = {Row(r)};
  return op;
}

// Plays both workers: writes each rank's planned files into the staging directory.
void WriteParts(Operation& op, const std::vector<RankPlan>& plans, const int32_t (&rows)[2][4]) {
  for (int r = 0; r < 2; ++r) {
    pb::SavePlanPart part;
    ASSERT_TRUE(part.ParseFromString(plans[r].part));
    std::vector<DataFilePlan> files;
    for (const pb::PlanFile& f : part.files()) {
      DataFilePlan plan;
      plan.writer_rank = r;
      for (const pb::PlanPiece& p : f.pieces()) {
        Region region{{p.region().offsets(0), 0}, {1, 4}, std::nullopt};
        plan.pieces.push_back(PieceData{p.key(), region, rows[r], 16});
      }
      files.push_back(plan);
    }
    pb::Manifest written;
    if (!files.empty()) {
      auto data = WriteDataFiles(part.staging_dir(), {TensorMeta{"w", DType::kI32, {2, 4}}}, files,
                                 0, WriteOptions());
      ASSERT_TRUE(data.ok()) << data.status();
      for (auto& p : data->pieces) *written.add_pieces() = p;
      for (auto& f : data->files) *written.add_files() = f;
    }
    op.ranks[r].written = written.SerializeAsString();
  }
}

TEST(SaveCommitterTest, StagesPlansAndCommitsAReadableCheckpoint) {
  const std::string path = TmpPath("commit-ok");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  const int32_t rows[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  ASSERT_NO_FATAL_FAILURE(WriteParts(op, *plans, rows));
  ASSERT_TRUE(saves.Commit(op).ok());
  op.phase = Phase::kDone;
  EXPECT_TRUE(saves.Finalize(op).ok());
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().step(), 42);
  EXPECT_EQ((*reader)->manifest().user_metadata().at("run"), "a");
  int32_t all[8] = {0};
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({2, 4}), all).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(all[i], i + 1);
  (void)RemoveTree(path);
}

// The manifest the committer builds on an arena, moving each rank's pieces, is byte for byte
// the one BuildManifest makes from copies of the merged records (its time aside).
TEST(SaveCommitterTest, CommittedManifestEqualsOneBuiltFromCopiedRecords) {
  const std::string path = TmpPath("commit-same");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  op.ranks[0].mesh_shape = {2};
  SaveCommitter saves;
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  const int32_t rows[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  ASSERT_NO_FATAL_FAILURE(WriteParts(op, *plans, rows));
  auto records = MergeWrittenRecords(op);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->pieces.size(), 2u);
  CheckpointContents info;
  info.saved_layout.set_world_size(2);
  info.saved_layout.add_mesh_shape(2);
  info.user_metadata = op.metadata;
  info.step = 42;
  pb::Manifest want = BuildManifest({TensorMeta{"w", DType::kI32, {2, 4}}}, *records, info,
                                    kDefaultChecksumBlockBytes);
  ASSERT_TRUE(saves.Commit(op).ok());
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  pb::Manifest got = (*reader)->manifest();
  auto merged = MergeManifest(op);
  ASSERT_TRUE(merged.ok()) << merged.status();
  for (pb::Manifest* m : {&want, &got, &*merged}) m->clear_created_unix_micros();
  EXPECT_EQ(SerializeManifest(got), SerializeManifest(want));
  EXPECT_EQ(SerializeManifest(*merged), SerializeManifest(want));
  (void)RemoveTree(path);
}

TEST(SaveCommitterTest, AbortedSaveLosesItsStagingDirectoryAndNeverAppears) {
  const std::string path = TmpPath("commit-abort");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  pb::SavePlanPart part;
  ASSERT_TRUE(part.ParseFromString((*plans)[0].part));
  ASSERT_TRUE(PathExists(part.staging_dir()));
  op.phase = Phase::kAborted;
  EXPECT_TRUE(saves.Finalize(op).ok());
  EXPECT_FALSE(PathExists(part.staging_dir()));
  EXPECT_FALSE(PathExists(path));
}

TEST(SaveCommitterTest, ExistingCheckpointIsNotOverwritten) {
  const std::string path = TmpPath("commit-exists");
  ASSERT_TRUE(MakeDir(path, /*exist_ok=*/true).ok());
  SaveCommitter saves;
  auto plans = saves.Plan(TwoRankSave(path));
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kAlreadyExists);
  (void)RemoveTree(path);
}

TEST(MergeManifestTest, UnreadableRecordOrBadStepIsNamed) {
  Operation op = TwoRankSave("/unused");
  op.ranks[1].written = "\xff\xff garbage";
  EXPECT_THAT(MergeManifest(op).status().message(), HasSubstr("rank 1 reported an unreadable"));
  op = TwoRankSave("/unused");
  op.metadata["step"] = "ten";
  EXPECT_THAT(MergeManifest(op).status().message(), HasSubstr("step=\"ten\""));
}

}  // namespace
}  // namespace ckpt::coordinator
