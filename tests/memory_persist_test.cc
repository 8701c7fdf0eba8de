// Background persistence of a memory checkpoint, end to end through the real cores on real
// files (in one process): each "worker" holds its rank's encoded data files and the replica of
// another rank's in its own MemoryTier (as worker/memory_save does), the coordinator's
// MemoryPersist assigns the files to holders, each holder's PersistHeldFiles writes them into
// the staging directory, and the storage commit protocol commits it. The result is compared
// with a direct storage save of the same state (WriteCheckpoint). The gRPC/WatchWork wiring
// between coordinator and worker daemons is not built yet (docs/services.md, "In-memory tier").
#include "coordinator/memory_persist.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/memory_catalog.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"
#include "storage/verify.h"
#include "worker/memory_persist.h"
#include "worker/memory_tier.h"

namespace ckpt {
namespace {

using coordinator::MemoryCheckpoint;
using coordinator::MemoryHolder;
using coordinator::MemoryPersist;
using coordinator::PersistAssignment;
using worker::MemoryTier;

constexpr int64_t kBlock = 4096;  // several checksum blocks per piece

// Two ranks, each holding half of the rows of "w" (64 x 100 f32) and all of "b" on rank 0.
struct State {
  std::vector<std::vector<float>> rows = std::vector<std::vector<float>>(2);
  std::vector<float> bias = std::vector<float>(100);
  CheckpointContents contents;
};

std::unique_ptr<State> MakeState() {
  auto s = std::make_unique<State>();
  s->contents.tensors = {TensorMeta{"w", DType::kF32, {64, 100}},
                         TensorMeta{"b", DType::kF32, {100}}};
  s->contents.step = 7;
  for (int r = 0; r < 2; ++r) {
    s->rows[r].resize(32 * 100);
    for (size_t i = 0; i < s->rows[r].size(); ++i) s->rows[r][i] = r * 1000.0f + i * 0.5f;
    DataFilePlan plan;
    plan.writer_rank = r;
    plan.pieces.push_back(PieceData{"w", Region{{32 * r, 0}, {32, 100}, std::nullopt},
                                    s->rows[r].data(), 32 * 100 * 4});
    if (r == 0) {
      for (size_t i = 0; i < s->bias.size(); ++i) s->bias[i] = -static_cast<float>(i);
      plan.pieces.push_back(
          PieceData{"b", Region{{0}, {100}, std::nullopt}, s->bias.data(), 100 * 4});
    }
    s->contents.files.push_back(plan);
  }
  return s;
}

// The memory save's result: worker w<r> holds rank r's file, w<1-r> its replica.
struct MemorySaved {
  std::map<std::string, std::unique_ptr<MemoryTier>> tiers;  // worker -> tier
  MemoryCheckpoint checkpoint;
};

MemorySaved SaveToMemory(const State& s) {
  MemorySaved out;
  WrittenData records;
  for (int w = 0; w < 2; ++w) {
    const std::string id = absl::StrCat("w", w);
    out.tiers[id] = std::make_unique<MemoryTier>(
        worker::MemoryTierOptions{1 << 20, 2, absl::StrCat("worker ", id)});
  }
  out.checkpoint.name = "m";
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<worker::EncodedFile> file =
        worker::EncodeDataFile(s.contents.tensors, s.contents.files[r], 0, kBlock);
    EXPECT_TRUE(file.ok()) << file.status();
    for (int w : {r, 1 - r}) {
      EXPECT_TRUE(out.tiers[absl::StrCat("w", w)]->Put("m", "op", file->name, file->bytes).ok());
    }
    out.checkpoint.holders[file->name] = {MemoryHolder{absl::StrCat("w", r), "hostA"},
                                          MemoryHolder{absl::StrCat("w", 1 - r), "hostB"}};
    for (auto& p : file->records.pieces) records.pieces.push_back(p);
    for (auto& f : file->records.files) records.files.push_back(f);
  }
  for (auto& [id, tier] : out.tiers) tier->Seal("m");
  out.checkpoint.manifest = BuildManifest(s.contents.tensors, records, s.contents, kBlock);
  return out;
}

// Runs the persistence: every pending worker writes its files; a worker in `dead` fails (its
// tier is gone) and its files go to another holder. Returns the commit's status.
absl::Status Persist(MemorySaved& saved, const std::string& path, bool overwrite,
                     const std::set<std::string>& dead) {
  absl::StatusOr<std::unique_ptr<MemoryPersist>> persist =
      MemoryPersist::Begin(saved.checkpoint, path, overwrite);
  if (!persist.ok()) return persist.status();
  for (const std::string& id : dead) saved.tiers[id]->Drop("m");  // killed with its memory
  while (!(*persist)->AllWritten()) {
    const PersistAssignment work = (*persist)->pending();
    for (const auto& [id, files] : work) {
      absl::StatusOr<int64_t> written = worker::PersistHeldFiles(
          *saved.tiers[id], "m", saved.checkpoint.manifest, files, (*persist)->staging_dir());
      absl::StatusOr<PersistAssignment> again = (*persist)->Report(id, files, written.status());
      if (!again.ok()) {
        (void)(*persist)->Abort();
        return again.status();
      }
    }
  }
  return (*persist)->Commit();
}

// The persisted checkpoint is the direct save's: same tensors, pieces (offsets, checksums),
// file records and data file bytes; ckptctl verify's check passes.
void ExpectSameAsDirectSave(const std::string& persisted, const std::string& direct) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> a = CheckpointReader::Open(persisted);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> b = CheckpointReader::Open(direct);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const pb::Manifest& ma = (*a)->manifest();
  const pb::Manifest& mb = (*b)->manifest();
  ASSERT_EQ(ma.tensors_size(), mb.tensors_size());
  for (int i = 0; i < ma.tensors_size(); ++i) {
    EXPECT_EQ(ma.tensors(i).SerializeAsString(), mb.tensors(i).SerializeAsString());
  }
  ASSERT_EQ(ma.pieces_size(), mb.pieces_size());
  for (int i = 0; i < ma.pieces_size(); ++i) {
    EXPECT_EQ(ma.pieces(i).SerializeAsString(), mb.pieces(i).SerializeAsString()) << i;
  }
  ASSERT_EQ(ma.files_size(), mb.files_size());
  for (int i = 0; i < ma.files_size(); ++i) {
    EXPECT_EQ(ma.files(i).SerializeAsString(), mb.files(i).SerializeAsString());
    EXPECT_EQ(*ReadWholeFile(JoinPath(persisted, ma.files(i).name()), 1 << 20),
              *ReadWholeFile(JoinPath(direct, mb.files(i).name()), 1 << 20));
  }
  EXPECT_EQ(ma.step(), mb.step());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(persisted, IoOptions());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty()) << report->problems[0];
  EXPECT_EQ(report->pieces, 3);
}

std::string DirectSave(const State& s, const std::string& path) {
  WriteOptions options;
  options.checksum_block_bytes = kBlock;
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(path, s.contents, options);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return path;
}

TEST(MemoryPersistE2eTest, PersistedCheckpointIsIdenticalToADirectSave) {
  const std::string dir = TestDir("memory_persist_e2e");
  std::unique_ptr<State> s = MakeState();
  MemorySaved saved = SaveToMemory(*s);
  const std::string path = JoinPath(dir, "persisted");
  ASSERT_TRUE(Persist(saved, path, false, {}).ok());
  ExpectSameAsDirectSave(path, DirectSave(*s, JoinPath(dir, "direct")));
}

TEST(MemoryPersistE2eTest, AHolderKilledMidPersistIsReplacedByTheReplica) {
  const std::string dir = TestDir("memory_persist_kill");
  std::unique_ptr<State> s = MakeState();
  MemorySaved saved = SaveToMemory(*s);
  const std::string path = JoinPath(dir, "persisted");
  absl::Status persisted = Persist(saved, path, false, {"w0"});
  ASSERT_TRUE(persisted.ok()) << persisted;
  ExpectSameAsDirectSave(path, DirectSave(*s, JoinPath(dir, "direct")));
}

TEST(MemoryPersistE2eTest, EveryHolderOfAFileLostFailsNamingItAndCommitsNothing) {
  const std::string dir = TestDir("memory_persist_lost");
  std::unique_ptr<State> s = MakeState();
  MemorySaved saved = SaveToMemory(*s);
  const std::string path = JoinPath(dir, "persisted");
  absl::Status failed = Persist(saved, path, false, {"w0", "w1"});
  ASSERT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed;
  EXPECT_NE(failed.message().find("data/r0_0.safetensors"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("data/r1_0.safetensors"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("worker w0"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("worker w1"), std::string::npos) << failed;
  EXPECT_FALSE(PathExists(path));
  absl::StatusOr<std::vector<std::string>> left = ListDir(dir);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << "staging left behind: " << (*left)[0];
}

TEST(MemoryPersistE2eTest, AnExistingCheckpointIsRefusedWithoutOverwriteAndStaysIntact) {
  const std::string dir = TestDir("memory_persist_existing");
  std::unique_ptr<State> s = MakeState();
  const std::string path = DirectSave(*s, JoinPath(dir, "existing"));
  const std::string manifest_before = *ReadWholeFile(JoinPath(path, "manifest.pb"), 1 << 20);
  s->rows[0][0] = 12345.0f;  // newer state in memory
  MemorySaved saved = SaveToMemory(*s);
  absl::Status refused = Persist(saved, path, /*overwrite=*/false, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_EQ(*ReadWholeFile(JoinPath(path, "manifest.pb"), 1 << 20), manifest_before);
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions());
  ASSERT_TRUE(report.ok() && report->problems.empty());
  // Asked to overwrite, it replaces the committed checkpoint with the new state.
  ASSERT_TRUE(Persist(saved, path, /*overwrite=*/true, {}).ok());
  ExpectSameAsDirectSave(path, DirectSave(*s, JoinPath(dir, "direct")));
}

}  // namespace
}  // namespace ckpt
