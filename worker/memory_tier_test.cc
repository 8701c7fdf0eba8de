#include "worker/memory_tier.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt::worker {
namespace {

std::shared_ptr<const std::string> Bytes(int64_t n, char c = 'x') {
  return std::make_shared<const std::string>(static_cast<size_t>(n), c);
}

TEST(MemoryTierTest, RefusesWhatDoesNotFitNamingWorkerAndBytesAndEvictsNothing) {
  MemoryTier tier({/*budget_bytes=*/100, /*keep_newest=*/2, "worker w-1 (host a)"});
  ASSERT_TRUE(tier.Put("a", "op-1", "f0", Bytes(60)).ok());
  absl::Status s = tier.Put("b", "op-2", "f0", Bytes(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("worker w-1 (host a)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("50 bytes"), std::string::npos) << s;
  EXPECT_TRUE(tier.Find("a", "f0").ok());  // in progress: never evicted
  EXPECT_EQ(tier.held_bytes(), 60);
}

TEST(MemoryTierTest, EvictsOlderCompleteCheckpointsButNeverTheNewestComplete) {
  MemoryTier tier({100, 5, "w"});
  ASSERT_TRUE(tier.Put("a", "op-1", "f", Bytes(40)).ok());
  tier.Seal("a");
  ASSERT_TRUE(tier.Put("b", "op-2", "f", Bytes(40)).ok());
  tier.Seal("b");
  // c needs 40: a (older complete) goes, b (newest complete) stays.
  ASSERT_TRUE(tier.Put("c", "op-3", "f", Bytes(40)).ok());
  EXPECT_FALSE(tier.Find("a", "f").ok());
  EXPECT_TRUE(tier.Find("b", "f").ok());
  // d needs 30 more: only b could go, and it is the newest complete one.
  EXPECT_EQ(tier.Put("d", "op-4", "f", Bytes(30)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(tier.Find("b", "f").ok());
}

TEST(MemoryTierTest, KeepsTheNewestKComplete) {
  MemoryTier tier({1000, 2, "w"});
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(tier.Put(name, std::string("op-") + name, "f", Bytes(10)).ok());
    tier.Seal(name);
  }
  EXPECT_EQ(tier.Find("a", "f").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tier.Find("b", "f").ok());
  EXPECT_TRUE(tier.Find("c", "f").ok());
  EXPECT_EQ(tier.held_bytes(), 20);
  // The plan's count overrides the worker's.
  tier.Seal("c", /*keep_newest=*/1);
  EXPECT_FALSE(tier.Find("b", "f").ok());
  EXPECT_TRUE(tier.Find("c", "f").ok());
}

TEST(MemoryTierTest, ReportsEachEvictionOnceForTheCoordinatorsCatalog) {
  MemoryTier tier({100, 5, "w"});
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(tier.Put(name, std::string("op-") + name, "f", Bytes(40)).ok());
    tier.Seal(name);
  }
  EXPECT_TRUE(tier.TakeEvicted().empty());
  ASSERT_TRUE(tier.Put("c", "op-c", "f", Bytes(40)).ok());  // the budget evicts a
  tier.Seal("c", /*keep_newest=*/1);                        // keep-newest evicts b
  EXPECT_EQ(tier.TakeEvicted(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(tier.TakeEvicted().empty());
  tier.Drop("c");  // an aborted save's files: never in the catalog, not an eviction
  EXPECT_TRUE(tier.TakeEvicted().empty());
}

TEST(MemoryTierTest, ASaveUnderAnotherOperationReplacesAnUncommittedLeftover) {
  MemoryTier tier({1000, 2, "w"});
  ASSERT_TRUE(tier.Put("a", "op-1", "f", Bytes(10, 'x')).ok());
  ASSERT_TRUE(tier.Put("a", "op-2", "g", Bytes(20, 'y')).ok());
  EXPECT_FALSE(tier.Find("a", "f").ok());
  EXPECT_EQ(tier.held_bytes(), 20);
  tier.Drop("a");
  EXPECT_EQ(tier.held_bytes(), 0);
}

TEST(MemoryTierTest, APinnedCheckpointIsNeverEvictedUntilUnpinned) {
  MemoryTier tier({100, 1, "worker w-1 (host a)"});
  tier.Pin("a");  // asked to be persisted: pinned before its first file arrives
  ASSERT_TRUE(tier.Put("a", "op-1", "f", Bytes(40)).ok());
  tier.Seal("a");
  ASSERT_TRUE(tier.Put("b", "op-2", "f", Bytes(40)).ok());
  tier.Seal("b");  // keep-newest 1 would evict a, but it awaits persistence
  EXPECT_TRUE(tier.Find("a", "f").ok());
  // c does not fit: b is the newest complete one and a is pinned.
  absl::Status s = tier.Put("c", "op-3", "f", Bytes(40));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("awaiting persistence"), std::string::npos) << s;
  tier.Unpin("a");  // persisted: keep-newest applies again
  EXPECT_FALSE(tier.Find("a", "f").ok());
  EXPECT_TRUE(tier.Find("b", "f").ok());
  EXPECT_TRUE(tier.Put("c", "op-3", "f", Bytes(40)).ok());
}

TEST(MemoryTierTest, ANewSaveReplacesAnEmptyCompleteLeftoverButKeepsAPinnedPlaceholder) {
  MemoryTier tier({1000, 2, "w"});
  tier.Seal("a");  // a rank with no files: complete here with nothing in it
  ASSERT_TRUE(tier.Put("a", "op-2", "f", Bytes(10)).ok());
  std::vector<HeldCheckpoint> held = tier.List();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_FALSE(held[0].complete);  // the new save is in progress, not complete
  EXPECT_EQ(held[0].operation_id, "op-2");
  tier.Pin("b");  // pinned before its first file: the placeholder is not a leftover
  ASSERT_TRUE(tier.Put("b", "op-3", "f", Bytes(10)).ok());
  held = tier.List();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_TRUE(held[1].pinned);
  EXPECT_FALSE(held[1].complete);
}

TEST(MemoryTierTest, APinOutlivesTheLeftoverItReplaces) {
  MemoryTier tier({1000, 1, "w"});
  ASSERT_TRUE(tier.Put("a", "op-1", "f", Bytes(10)).ok());  // a save that never committed
  tier.Pin("a");
  ASSERT_TRUE(tier.Put("a", "op-2", "g", Bytes(10)).ok());
  tier.Seal("a");
  ASSERT_TRUE(tier.Put("b", "op-3", "f", Bytes(10)).ok());
  tier.Seal("b");
  EXPECT_TRUE(tier.Find("a", "g").ok());
  std::vector<HeldCheckpoint> held = tier.List();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_TRUE(held[0].pinned);
  EXPECT_FALSE(held[1].pinned);
}

// The encoded file is byte for byte the file WriteDataFiles writes, with the same records.
TEST(MemoryTierTest, EncodedFileEqualsTheStorageWritersFile) {
  std::vector<float> values(3000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  TensorMeta t;
  t.key = "w";
  t.dtype = DType::kF32;
  t.global_shape = {3000};
  DataFilePlan plan;
  plan.writer_rank = 1;
  plan.pieces.push_back(PieceData{"w", Region{{0}, {1000}, std::nullopt}, values.data(), 4000});
  plan.pieces.push_back(
      PieceData{"w", Region{{1000}, {2000}, std::nullopt}, values.data() + 1000, 8000});
  const int64_t block = 1024;  // several blocks per piece
  absl::StatusOr<EncodedFile> encoded = EncodeDataFile({t}, plan, 0, block);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::string dir = TestDir("memory_tier");
  ASSERT_TRUE(MakeDir(dir + "/data", /*exist_ok=*/true).ok());
  WriteOptions options;
  options.checksum_block_bytes = block;
  absl::StatusOr<WrittenData> written = WriteDataFiles(dir, {t}, {plan}, 0, options);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::string> on_disk = ReadWholeFile(JoinPath(dir, encoded->name), 1 << 20);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(*encoded->bytes, *on_disk);
  ASSERT_EQ(encoded->records.pieces.size(), written->pieces.size());
  for (size_t i = 0; i < written->pieces.size(); ++i) {
    EXPECT_EQ(encoded->records.pieces[i].SerializeAsString(),
              written->pieces[i].SerializeAsString());
  }

  // Reading back through the tier verifies the checksums; a flipped byte is DataLoss.
  MemoryTier tier({1 << 20, 2, "w"});
  ASSERT_TRUE(tier.Put("m", "op", encoded->name, encoded->bytes).ok());
  pb::Manifest manifest;
  manifest.set_checksum_block_bytes(block);
  for (const pb::StoredPiece& p : encoded->records.pieces) *manifest.add_pieces() = p;
  std::vector<float> out(10);
  ASSERT_TRUE(ReadHeldPieces(tier, "m", manifest, {PieceRead{1, 400, 440, out.data()}}).ok());
  EXPECT_EQ(out[0], values[1100]);
  auto corrupt = std::make_shared<std::string>(*encoded->bytes);
  (*corrupt)[corrupt->size() - 1] ^= 1;
  ASSERT_TRUE(tier.Put("m", "op", encoded->name, corrupt).ok());
  absl::Status s = ReadHeldPieces(tier, "m", manifest, {PieceRead{1, 7996, 8000, out.data()}});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(ReadHeldPieces(tier, "gone", manifest, {PieceRead{0, 0, 4, out.data()}}).code(),
            absl::StatusCode::kNotFound);
}

TEST(MemoryTierTest, KeepsTheCoordinatorsRecordAndPersistOutcomeOfCompleteCheckpoints) {
  MemoryTier tier({100, 2, "w"});
  ASSERT_TRUE(tier.Put("a", "op-1", "f", Bytes(10)).ok());
  EXPECT_FALSE(tier.Record("a", "rec"));  // not complete yet: its commit cannot have happened
  EXPECT_FALSE(tier.Record("never", "rec"));
  tier.Pin("a");
  tier.Seal("a");
  EXPECT_TRUE(tier.Record("a", "rec"));
  tier.Unpin("a", "persisted to /p");
  std::vector<HeldCheckpoint> held = tier.List();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].record, "rec");
  EXPECT_EQ(held[0].persist_outcome, "persisted to /p");
  EXPECT_FALSE(held[0].pinned);
  EXPECT_EQ(held[0].files, std::vector<std::string>{"f"});
}

// The names held, sorted.
std::vector<std::string> Names(const MemoryTier& tier) {
  std::vector<std::string> names;
  for (const HeldCheckpoint& h : tier.List()) names.push_back(h.name);
  return names;
}

TEST(MemoryTierTest, KeepsTheNewestKPerRetentionGroup) {
  MemoryTier tier({1000, 2, "w"});
  // Interleaved: memory checkpoints (group "") and versions of two published names.
  for (const char* name : {"a1", "p.v1", "a2", "p.v2", "q.v1", "a3", "p.v3"}) {
    const std::string n = name;
    const std::string group = n[0] == 'a' ? "" : n[0] == 'p' ? "xfer:p" : "xfer:q";
    ASSERT_TRUE(tier.Put(n, "op-" + n, "f", Bytes(10)).ok());
    tier.Seal(n, /*keep_newest=*/2, group);
  }
  // Each group keeps its own newest two; a publish never evicts a memory checkpoint.
  EXPECT_EQ(Names(tier), (std::vector<std::string>{"a2", "a3", "p.v2", "p.v3", "q.v1"}));
  std::vector<std::string> evicted = tier.TakeEvicted();
  std::sort(evicted.begin(), evicted.end());
  EXPECT_EQ(evicted, (std::vector<std::string>{"a1", "p.v1"}));
}

TEST(MemoryTierTest, APinnedCheckpointOutlivesItsGroupsKeepNewestUntilUnpinned) {
  MemoryTier tier({1000, 1, "w"});
  ASSERT_TRUE(tier.Put("a1", "op-1", "f", Bytes(10)).ok());
  tier.Pin("a1");  // awaiting persistence
  tier.Seal("a1", 1);
  ASSERT_TRUE(tier.Put("a2", "op-2", "f", Bytes(10)).ok());
  tier.Seal("a2", 1);
  ASSERT_TRUE(tier.Put("p.v1", "op-3", "f", Bytes(10)).ok());
  tier.Seal("p.v1", 1, "xfer:p");
  EXPECT_EQ(Names(tier), (std::vector<std::string>{"a1", "a2", "p.v1"}));
  tier.Unpin("a1", "persisted to /x");  // now keep-newest of its group applies
  EXPECT_EQ(Names(tier), (std::vector<std::string>{"a2", "p.v1"}));
}

TEST(MemoryTierTest, TheBudgetNeverEvictsTheNewestCheckpointOfAnyGroup) {
  MemoryTier tier({100, 5, "w"});
  ASSERT_TRUE(tier.Put("a1", "op-1", "f", Bytes(30)).ok());
  tier.Seal("a1");
  ASSERT_TRUE(tier.Put("p.v1", "op-2", "f", Bytes(30)).ok());
  tier.Seal("p.v1", 0, "xfer:p");
  ASSERT_TRUE(tier.Put("a2", "op-3", "f", Bytes(30)).ok());
  tier.Seal("a2");
  // 90 held; 30 more: only a1 may go (p.v1 is its name's only version).
  ASSERT_TRUE(tier.Put("p.v2", "op-4", "f", Bytes(30)).ok());
  EXPECT_EQ(Names(tier), (std::vector<std::string>{"a2", "p.v1", "p.v2"}));
  tier.Seal("p.v2", 0, "xfer:p");
  // Now p.v1 is not its group's newest: it goes for the next file.
  ASSERT_TRUE(tier.Put("q.v1", "op-5", "f", Bytes(30)).ok());
  EXPECT_EQ(Names(tier), (std::vector<std::string>{"a2", "p.v2", "q.v1"}));
}

}  // namespace
}  // namespace ckpt::worker
