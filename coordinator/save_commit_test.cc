#include "coordinator/save_commit.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"

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
    ASSERT_TRUE(part.ParseFromString(plans[r].part.Bytes()));
    std::vector<DataFilePlan> files;
    for (const pb::PlanFile& f : part.files()) {
      DataFilePlan plan;
      plan.writer_rank = r;
      for (const pb::PlanPiece& p : f.pieces()) {  // named by local index: the rank's own
        const pb::PieceMeta own = op.ranks[r].shards[p.local_index()];
        Region region{{own.region().offsets(0), 0}, {1, 4}, std::nullopt};
        plan.pieces.push_back(PieceData{own.tensor().key(), region, rows[r], 16});
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

// Plans `op` with `saves` and plays both workers: rank 0 writes 1..4, rank 1 writes 5..8.
void PlanAndWrite(SaveCommitter& saves, Operation& op) {
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  const int32_t rows[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  ASSERT_NO_FATAL_FAILURE(WriteParts(op, *plans, rows));
}

TEST(SaveCommitterTest, StagesPlansAndCommitsAReadableCheckpoint) {
  const std::string path = TmpPath("commit-ok");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  ASSERT_NO_FATAL_FAILURE(PlanAndWrite(saves, op));
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
  ASSERT_NO_FATAL_FAILURE(PlanAndWrite(saves, op));
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
  auto merged = MergeManifest(op);  // before the commit, which consumes the records
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(saves.Commit(op).ok());
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  pb::Manifest got = (*reader)->manifest();
  for (pb::Manifest* m : {&want, &got, &*merged}) m->clear_created_unix_micros();
  EXPECT_EQ(SerializeManifest(got), SerializeManifest(want));
  EXPECT_EQ(SerializeManifest(*merged), SerializeManifest(want));
  (void)RemoveTree(path);
}

// Row `rank` of tensor `key` (`ranks` x 8 int32 elements).
pb::PieceMeta RowOf(const std::string& key, int rank, int ranks) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key(key);
  s.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  s.mutable_tensor()->add_global_shape(ranks);
  s.mutable_tensor()->add_global_shape(8);
  s.mutable_region()->add_offsets(rank);
  s.mutable_region()->add_offsets(0);
  s.mutable_region()->add_lengths(1);
  s.mutable_region()->add_lengths(8);
  return s;
}

// A save of `ranks` ranks, each holding its row of three tensors, with the record of what
// each wrote (one data file of its three rows; the bytes are not read by the commit).
Operation ManyRankSave(const std::string& path, int ranks) {
  Operation op;
  op.id = "op-9";
  op.job = "many";
  op.kind = OperationKind::kSave;
  op.path = path;
  op.world_size = ranks;
  op.ranks.resize(ranks);
  op.metadata = {{"step", "7"}, {"run", "b"}, {"zeta", "1"}, {"alpha", "2"}, {"mid", "3"}};
  const std::vector<std::string> keys = {"layers.0.w", "layers.1.w", "embedding.w"};
  for (int r = 0; r < ranks; ++r) {
    std::vector<pb::PieceMeta> rows;
    for (const std::string& key : keys) rows.push_back(RowOf(key, r, ranks));
    op.ranks[r].shards = RankPieces(std::move(rows));
    op.ranks[r].mesh_shape = {ranks};
    pb::Manifest written;
    pb::DataFile* file = written.add_files();
    file->set_name(DataFileName(r, 0));
    file->set_writer_rank(r);
    file->set_data_start(4096);
    file->set_size_bytes(4096 + 32 * static_cast<int64_t>(keys.size()));
    for (size_t k = 0; k < keys.size(); ++k) {
      const Region region{{r, 0}, {1, 8}, std::nullopt};
      pb::StoredPiece* p = written.add_pieces();
      p->set_key(keys[k]);
      *p->mutable_region() = RegionToProto(region);
      p->set_file(file->name());
      p->set_entry_name(EncodeEntryName(keys[k], region));
      p->set_byte_offset(4096 + 32 * static_cast<int64_t>(k));
      p->set_byte_length(32);
      p->set_xxh3_64(0x9E3779B97F4A7C15ull * (r * 3 + k + 1));
      p->set_writer_rank(r);
    }
    op.ranks[r].written = written.SerializeAsString();
  }
  return op;
}

// The staging directory a rank's plan part names.
std::string StagingOf(const RankPlan& plan) {
  pb::SavePlanPart part;
  EXPECT_TRUE(part.ParseFromString(plan.part.Bytes()));
  return part.staging_dir();
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The streamed manifest.pb holds exactly the bytes of SerializeManifest(MergeManifest(op)),
// the whole merged message (with the commit's creation time), for many ranks.
TEST(SaveCommitterTest, StreamedManifestFileIsByteIdenticalToTheMergedManifest) {
  const std::string path = TmpPath("commit-bytes");
  (void)RemoveTree(path);
  Operation op = ManyRankSave(path, 37);
  SaveCommitter saves;
  ASSERT_TRUE(saves.Plan(op).ok());
  auto merged = MergeManifest(op);  // before the commit, which consumes the records
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(ValidateManifest(*merged).ok()) << ValidateManifest(*merged);
  absl::Status committed = saves.Commit(op);
  ASSERT_TRUE(committed.ok()) << committed;
  const std::string bytes = ReadFileBytes(path + "/manifest.pb");
  pb::Manifest got;
  ASSERT_TRUE(got.ParseFromString(bytes));
  merged->set_created_unix_micros(got.created_unix_micros());
  EXPECT_EQ(got.pieces_size(), 37 * 3);
  EXPECT_TRUE(bytes == SerializeManifest(*merged)) << "the streamed bytes differ";
  EXPECT_TRUE(ParseManifest(bytes, "manifest.pb").ok());  // valid as a reader sees it
  (void)RemoveTree(path);
}

// Budgets that force a small manifest into piece files (a daemon's: 2 GiB and 1 GiB).
ManifestFileOptions TinyManifestFiles(int64_t piece_file_bytes) {
  ManifestFileOptions options;
  options.max_single_file_bytes = 2048;
  options.piece_file_bytes = piece_file_bytes;
  return options;
}

// A manifest larger than one file may hold (here 2 KiB; 2 GiB in a daemon) is committed with
// its pieces in piece files of at most the budget: manifest.pb (format 2) lists them, and the
// manifest read back is the merged one, its pieces in order.
TEST(SaveCommitterTest, ManifestTooLargeForOneFileIsCommittedInPieceFiles) {
  const std::string path = TmpPath("commit-piece-files");
  (void)RemoveTree(path);
  Operation op = ManyRankSave(path, 37);
  SaveCommitter saves(/*journal=*/nullptr, TinyManifestFiles(/*piece_file_bytes=*/1024));
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  auto merged = MergeManifest(op);  // before the commit, which consumes the records
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_GT(SerializeManifest(*merged).size(), 2048u);
  const std::string staging = StagingOf((*plans)[0]);
  absl::Status committed = saves.Commit(op);
  ASSERT_TRUE(committed.ok()) << committed;
  op.phase = Phase::kDone;
  EXPECT_TRUE(saves.Finalize(op).ok());
  EXPECT_FALSE(PathExists(staging));  // renamed into place, piece files and all

  pb::Manifest top;
  ASSERT_TRUE(top.ParseFromString(ReadFileBytes(path + "/manifest.pb")));
  EXPECT_EQ(top.format_version(), kManifestPieceFilesFormatVersion);
  EXPECT_EQ(top.pieces_size(), 0);
  ASSERT_GE(top.piece_files_size(), 2);
  int64_t listed = 0;
  for (const pb::ManifestPieceFile& f : top.piece_files()) {
    EXPECT_LE(f.size_bytes(), 1024) << f.name();
    EXPECT_EQ(static_cast<int64_t>(ReadFileBytes(path + "/" + f.name()).size()), f.size_bytes());
    listed += f.piece_count();
  }
  EXPECT_EQ(listed, 37 * 3);
  absl::StatusOr<pb::Manifest> got = ReadManifestFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->piece_files_size(), top.piece_files_size());
  got->set_format_version(kManifestFormatVersion);
  got->clear_piece_files();
  merged->set_created_unix_micros(got->created_unix_micros());
  EXPECT_TRUE(SerializeManifest(*got) == SerializeManifest(*merged)) << "the manifests differ";
  (void)RemoveTree(path);
}

// A checkpoint committed with one piece per piece file loads bit-exact.
TEST(SaveCommitterTest, PieceFileCheckpointLoadsBitExact) {
  const std::string path = TmpPath("commit-piece-files-load");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  ManifestFileOptions options = TinyManifestFiles(/*piece_file_bytes=*/1);
  options.max_single_file_bytes = 1;
  SaveCommitter saves(/*journal=*/nullptr, options);
  ASSERT_NO_FATAL_FAILURE(PlanAndWrite(saves, op));
  ASSERT_TRUE(saves.Commit(op).ok());
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().piece_files_size(), 2);
  int32_t all[8] = {0};
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({2, 4}), all).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(all[i], i + 1);
  (void)RemoveTree(path);
}

// The commit frees each rank's written record once it is merged (their buffers, not only
// their contents): the records and the manifest are never all in memory at once.
TEST(SaveCommitterTest, CommitFreesEveryRanksWrittenRecord) {
  const std::string path = TmpPath("commit-frees");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  ASSERT_NO_FATAL_FAILURE(PlanAndWrite(saves, op));
  ASSERT_GT(op.ranks[0].written.size(), std::string().capacity());
  ASSERT_TRUE(saves.Commit(op).ok());
  for (const RankEntry& rank : op.ranks) {
    EXPECT_EQ(rank.written.capacity(), std::string().capacity());
  }
  EXPECT_TRUE(CheckpointReader::Open(path).ok());
  (void)RemoveTree(path);
}

// A rank whose record cannot be read fails the commit with DataLoss naming it, and nothing
// appears at the checkpoint's path.
TEST(SaveCommitterTest, UnreadableRecordFailsTheCommitNamingTheRank) {
  const std::string path = TmpPath("commit-unreadable");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  ASSERT_NO_FATAL_FAILURE(PlanAndWrite(saves, op));
  op.ranks[1].written = "\xff\xff garbage";
  absl::Status committed = saves.Commit(op);
  EXPECT_EQ(committed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(committed.message(), HasSubstr("rank 1 reported an unreadable"));
  op.phase = Phase::kAborted;
  EXPECT_TRUE(saves.Finalize(op).ok());
  EXPECT_FALSE(PathExists(path));
}

// Plans and writes a two-rank save of `job` to `path`; `tamper` may edit each rank's record
// (as the worker reported it) before the commit, whose status is returned.
absl::Status SaveOnce(SaveCommitter& saves, const std::string& job, const std::string& path,
                      const int32_t (&rows)[2][4],
                      const std::function<void(int, pb::Manifest*)>& tamper = nullptr) {
  Operation op = TwoRankSave(path);
  op.job = job;
  op.id = absl::StrCat("op-", path);
  auto plans = saves.Plan(op);
  if (!plans.ok()) return plans.status();
  WriteParts(op, *plans, rows);
  for (int r = 0; tamper != nullptr && r < 2; ++r) {
    pb::Manifest written;
    written.ParseFromString(op.ranks[r].written);
    tamper(r, &written);
    op.ranks[r].written = written.SerializeAsString();
  }
  absl::Status committed = saves.Commit(op);
  op.phase = committed.ok() ? Phase::kDone : Phase::kAborted;
  (void)saves.Finalize(op);
  return committed;
}

// A repeat save of the same layout commits without validating the manifest again, and what it
// commits is what a fully validated commit writes; another job's save does not reuse it.
TEST(SaveCommitterTest, RepeatSaveOfUnchangedLayoutReusesTheValidation) {
  const std::string first = TmpPath("reuse-1"), second = TmpPath("reuse-2");
  const std::string other = TmpPath("reuse-3");
  for (const std::string& p : {first, second, other}) (void)RemoveTree(p);
  SaveCommitter saves;
  const int32_t a[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  const int32_t b[2][4] = {{9, 10, 11, 12}, {13, 14, 15, 16}};
  ASSERT_TRUE(SaveOnce(saves, "j", first, a).ok());
  EXPECT_EQ(saves.validations_reused(), 0);
  ASSERT_TRUE(SaveOnce(saves, "j", second, b).ok());
  EXPECT_EQ(saves.validations_reused(), 1);
  ASSERT_TRUE(SaveOnce(saves, "k", other, b).ok());
  EXPECT_EQ(saves.validations_reused(), 1);
  auto reused = CheckpointReader::Open(second);  // validates the manifest it reads
  auto validated = CheckpointReader::Open(other);
  ASSERT_TRUE(reused.ok()) << reused.status();
  ASSERT_TRUE(validated.ok()) << validated.status();
  int32_t all[8] = {0};
  ASSERT_TRUE((*reused)->ReadRegion("w", WholeRegion({2, 4}), all).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(all[i], i + 9);
  pb::Manifest got = (*reused)->manifest(), want = (*validated)->manifest();
  got.clear_created_unix_micros();
  want.clear_created_unix_micros();
  EXPECT_EQ(SerializeManifest(got), SerializeManifest(want));
  for (const std::string& p : {first, second, other}) (void)RemoveTree(p);
}

// A repeat save whose pieces lie elsewhere (here rank 1 claims rank 0's row, so row 1 is
// stored by nobody) is a changed layout: it is validated in full and refused.
TEST(SaveCommitterTest, ChangedLayoutIsValidatedInFull) {
  const std::string first = TmpPath("changed-1"), second = TmpPath("changed-2");
  for (const std::string& p : {first, second}) (void)RemoveTree(p);
  SaveCommitter saves;
  const int32_t a[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  ASSERT_TRUE(SaveOnce(saves, "j", first, a).ok());
  absl::Status refused = SaveOnce(saves, "j", second, a, [](int rank, pb::Manifest* written) {
    if (rank != 1) return;
    pb::StoredPiece* p = written->mutable_pieces(0);
    p->mutable_region()->set_offsets(0, 0);
    p->set_entry_name(EncodeEntryName("w", Region{{0, 0}, {1, 4}, std::nullopt}));
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("tensor \"w\""));
  EXPECT_EQ(saves.validations_reused(), 0);
  EXPECT_FALSE(PathExists(second));
  for (const std::string& p : {first, second}) (void)RemoveTree(p);
}

// Two ranks that described their state with digests `d0`, `d1` (a repeat save may reuse a plan).
Operation DigestedSave(const std::string& id, const std::string& path, const std::string& d1) {
  Operation op = TwoRankSave(path);
  op.id = id;
  op.ranks[0].description_digest = "d0";
  op.ranks[1].description_digest = d1;
  return op;
}

// ReusedPlan gives the job's kept plan for unchanged digests, naming the staging directory
// Prepare made (and Plan then uses that one too, making no other); nothing before Prepare,
// and nothing for a changed digest.
TEST(SaveCommitterTest, ReusedPlanIsTheKeptPlanInThePreparedStagingDirectory) {
  const std::string first = TmpPath("kept-1"), second = TmpPath("kept-2");
  const std::string third = TmpPath("kept-3");
  for (const std::string& p : {first, second, third}) (void)RemoveTree(p);
  SaveCommitter saves;
  Operation planned = DigestedSave("op-1", first, "d1");
  ASSERT_TRUE(saves.Plan(planned).ok());

  Operation repeat = DigestedSave("op-2", second, "d1");
  EXPECT_FALSE(saves.ReusedPlan(repeat).has_value());  // not prepared
  Operation header = repeat;
  header.ranks.clear();
  ASSERT_TRUE(saves.Prepare(header).ok());
  std::optional<std::vector<RankPlan>> kept = saves.ReusedPlan(repeat);
  ASSERT_TRUE(kept.has_value());
  ASSERT_EQ(kept->size(), 2u);
  const std::string staging = StagingOf((*kept)[0]);
  EXPECT_TRUE(PathExists(staging)) << staging;
  EXPECT_THAT(staging, HasSubstr("kept-2"));
  for (const RankPlan& plan : *kept) {
    EXPECT_TRUE(plan.reused);
    EXPECT_EQ(StagingOf(plan), staging);
  }
  absl::StatusOr<std::vector<RankPlan>> planned_again = saves.Plan(repeat);
  ASSERT_TRUE(planned_again.ok()) << planned_again.status();
  EXPECT_EQ(StagingOf((*planned_again)[1]), staging);

  Operation changed = DigestedSave("op-3", third, "d1-changed");
  ASSERT_TRUE(saves.Prepare(changed).ok());
  EXPECT_FALSE(saves.ReusedPlan(changed).has_value());
  for (Operation* op : {&planned, &repeat, &changed}) {
    op->phase = Phase::kAborted;
    EXPECT_TRUE(saves.Finalize(*op).ok());
  }
  EXPECT_FALSE(PathExists(staging));
  for (const std::string& p : {first, second, third}) (void)RemoveTree(p);
}

TEST(SaveCommitterTest, AbortedSaveLosesItsStagingDirectoryAndNeverAppears) {
  const std::string path = TmpPath("commit-abort");
  (void)RemoveTree(path);
  Operation op = TwoRankSave(path);
  SaveCommitter saves;
  auto plans = saves.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  pb::SavePlanPart part;
  ASSERT_TRUE(part.ParseFromString((*plans)[0].part.Bytes()));
  ASSERT_TRUE(PathExists(part.staging_dir()));
  op.phase = Phase::kAborted;
  EXPECT_TRUE(saves.Finalize(op).ok());
  EXPECT_FALSE(PathExists(part.staging_dir()));
  EXPECT_FALSE(PathExists(path));
}

TEST(SaveCommitterTest, ExistingCheckpointIsNotOverwritten) {
  const std::string path = TmpPath("commit-exists");
  ASSERT_TRUE(MakeDir(path, /*exist_ok=*/true).ok());
  // An empty directory would be committed over (as DCP writes into one): this one holds a file.
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), "").ok());
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
