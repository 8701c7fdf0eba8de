#include "worker/memory_persist.h"

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

// One tensor "w" of 3000 floats in one encoded file, held by a tier under "m".
struct Held {
  std::vector<float> values = std::vector<float>(3000);
  TensorMeta tensor;
  DataFilePlan plan;
  EncodedFile file;
  pb::Manifest manifest;
  MemoryTier tier{{1 << 20, 2, "worker w-1 (host a)"}};
};

std::unique_ptr<Held> MakeHeld() {
  auto h = std::make_unique<Held>();
  for (size_t i = 0; i < h->values.size(); ++i) h->values[i] = static_cast<float>(i) + 0.25f;
  h->tensor = TensorMeta{"w", DType::kF32, {3000}};
  h->plan.writer_rank = 0;
  h->plan.pieces.push_back(
      PieceData{"w", Region{{0}, {3000}, std::nullopt}, h->values.data(), 12000});
  absl::StatusOr<EncodedFile> encoded = EncodeDataFile({h->tensor}, h->plan, 0, 1024);
  EXPECT_TRUE(encoded.ok()) << encoded.status();
  h->file = *std::move(encoded);
  h->manifest = BuildManifest({h->tensor}, h->file.records, CheckpointContents(), 1024);
  EXPECT_TRUE(h->tier.Put("m", "op", h->file.name, h->file.bytes).ok());
  return h;
}

TEST(MemoryPersistTest, WritesTheHeldBytesIntoTheStagingDirectory) {
  std::unique_ptr<Held> h = MakeHeld();
  const std::string dir = TestDir("memory_persist");
  ASSERT_TRUE(MakeDir(dir + "/data", /*exist_ok=*/true).ok());
  absl::StatusOr<int64_t> written =
      PersistHeldFiles(h->tier, "m", h->manifest, {h->file.name}, dir);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, static_cast<int64_t>(h->file.bytes->size()));
  absl::StatusOr<std::string> on_disk = ReadWholeFile(JoinPath(dir, h->file.name), 1 << 20);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(*on_disk, *h->file.bytes);
}

TEST(MemoryPersistTest, RefusesCorruptedMemoryAndWritesNothing) {
  std::unique_ptr<Held> h = MakeHeld();
  auto corrupt = std::make_shared<std::string>(*h->file.bytes);
  (*corrupt)[corrupt->size() - 3] ^= 1;
  ASSERT_TRUE(h->tier.Put("m", "op", h->file.name, corrupt).ok());
  const std::string dir = TestDir("memory_persist_corrupt");
  ASSERT_TRUE(MakeDir(dir + "/data", /*exist_ok=*/true).ok());
  absl::StatusOr<int64_t> written =
      PersistHeldFiles(h->tier, "m", h->manifest, {h->file.name}, dir);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(written.status().message().find("\"w\""), std::string::npos) << written.status();
  EXPECT_FALSE(PathExists(JoinPath(dir, h->file.name)));
}

TEST(MemoryPersistTest, AFileNotHeldHereIsNotFoundNamingWorkerAndFile) {
  std::unique_ptr<Held> h = MakeHeld();
  h->tier.Drop("m");
  const std::string dir = TestDir("memory_persist_gone");
  ASSERT_TRUE(MakeDir(dir + "/data", /*exist_ok=*/true).ok());
  absl::StatusOr<int64_t> written =
      PersistHeldFiles(h->tier, "m", h->manifest, {h->file.name}, dir);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(written.status().message().find("worker w-1 (host a)"), std::string::npos);
  absl::StatusOr<int64_t> unknown =
      PersistHeldFiles(h->tier, "m", h->manifest, {"data/r9_0.safetensors"}, dir);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::worker
