#include "storage/checkpoint_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_file.h"
#include "storage/test_dir.h"
#include "storage/verify.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// Writes a real checkpoint at `path`: a [96, 40] float32 tensor in three row blocks of two
// writer ranks and a bf16 vector, with `seed`-determined bytes.
pb::Manifest WriteSource(const std::string& path, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<std::string>> bytes;
  auto piece = [&](const std::string& key, Region region, int64_t size) {
    bytes.push_back(std::make_unique<std::string>(size, '\0'));
    for (char& c : *bytes.back()) c = static_cast<char>(rng());
    return PieceData{key, std::move(region), bytes.back()->data(), size};
  };
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kF32, {96, 40}}, TensorMeta{"b", DType::kBF16, {777}}};
  contents.files = {
      DataFilePlan{0,
                   {piece("w", Region{{0, 0}, {32, 40}, std::nullopt}, 32 * 40 * 4),
                    piece("b", Region{{0}, {777}, std::nullopt}, 777 * 2)}},
      DataFilePlan{1,
                   {piece("w", Region{{32, 0}, {32, 40}, std::nullopt}, 32 * 40 * 4),
                    piece("w", Region{{64, 0}, {32, 40}, std::nullopt}, 32 * 40 * 4)}}};
  WriteOptions options;
  options.checksum_block_bytes = 4096;  // pieces of several blocks: hash lists
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(path, contents, options);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return manifest.ok() ? *manifest : pb::Manifest();
}

// Overwrites one byte of `file` at `offset`.
void FlipByte(const std::string& file, int64_t offset) {
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, offset), 1);
  c ^= 0x5A;
  ASSERT_EQ(::pwrite(fd, &c, 1, offset), 1);
  ::close(fd);
}

void ExpectSame(const std::string& a, const std::string& b) {
  absl::StatusOr<pb::Manifest> ma = ReadManifestFile(a);
  absl::StatusOr<pb::Manifest> mb = ReadManifestFile(b);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_EQ(ma->SerializeAsString(), mb->SerializeAsString());
  for (const pb::DataFile& file : ma->files()) {
    EXPECT_EQ(*ReadWholeFile(JoinPath(a, file.name()), 1 << 30),
              *ReadWholeFile(JoinPath(b, file.name()), 1 << 30))
        << file.name();
  }
  absl::StatusOr<VerifyReport> verified = VerifyCheckpoint(b, IoOptions{});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->problems.empty());
}

TEST(CheckpointCopyTest, CopiesEveryByteAndVerifiesEveryPieceInChunksThatCrossPieces) {
  const std::string dir = TestDir("copy-roundtrip");
  const std::string from = JoinPath(dir, "from"), to = JoinPath(dir, "to");
  const pb::Manifest manifest = WriteSource(from, 1);
  for (int parallelism : {1, 3}) {
    CopyOptions options;
    options.chunk_bytes = 777;  // never aligned with a piece or a checksum block
    options.parallelism = parallelism;
    options.overwrite = true;
    absl::StatusOr<CopyReport> report = CopyCheckpoint(from, "file://" + to, options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->files, manifest.files_size());
    EXPECT_EQ(report->pieces_verified, manifest.pieces_size());
    ExpectSame(from, to);
  }
}

TEST(CheckpointCopyTest, AFlippedSourceByteIsDataLossNamingTheTensorAndNothingIsCommitted) {
  const std::string dir = TestDir("copy-flipped");
  const std::string from = JoinPath(dir, "from"), to = JoinPath(dir, "to");
  const pb::Manifest manifest = WriteSource(from, 2);
  const pb::StoredPiece& piece = manifest.pieces(1);
  FlipByte(JoinPath(from, piece.file()), piece.byte_offset() + piece.byte_length() - 3);
  absl::StatusOr<CopyReport> report = CopyCheckpoint(from, to);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss) << report.status();
  EXPECT_THAT(report.status().message(), HasSubstr(piece.key()));
  EXPECT_THAT(report.status().message(), HasSubstr(piece.file()));
  const CheckpointProbe probe = ProbeCheckpoint(to);
  EXPECT_EQ(probe.state, CheckpointState::kMissing);
  EXPECT_TRUE(probe.leftovers.empty()) << probe.leftovers[0];
}

TEST(CheckpointCopyTest, ATruncatedSourceFileIsDataLossNamingIt) {
  const std::string dir = TestDir("copy-truncated");
  const std::string from = JoinPath(dir, "from"), to = JoinPath(dir, "to");
  const pb::Manifest manifest = WriteSource(from, 3);
  const std::string file = JoinPath(from, manifest.files(0).name());
  ASSERT_EQ(::truncate(file.c_str(), manifest.files(0).size_bytes() - 100), 0);
  absl::StatusOr<CopyReport> report = CopyCheckpoint(from, to);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss) << report.status();
  EXPECT_THAT(report.status().message(), HasSubstr(manifest.files(0).name()));
  EXPECT_EQ(ProbeCheckpoint(to).state, CheckpointState::kMissing);
}

TEST(CheckpointCopyTest, AFailedOverwriteKeepsTheEarlierCheckpoint) {
  const std::string dir = TestDir("copy-overwrite");
  const std::string a = JoinPath(dir, "a"), b = JoinPath(dir, "b"), to = JoinPath(dir, "to");
  WriteSource(a, 4);
  const pb::Manifest mb = WriteSource(b, 5);
  ASSERT_TRUE(CopyCheckpoint(a, to).ok());
  EXPECT_EQ(CopyCheckpoint(b, to).status().code(), absl::StatusCode::kAlreadyExists);
  FlipByte(JoinPath(b, mb.pieces(0).file()), mb.pieces(0).byte_offset());
  CopyOptions overwrite;
  overwrite.overwrite = true;
  EXPECT_EQ(CopyCheckpoint(b, to, overwrite).status().code(), absl::StatusCode::kDataLoss);
  ExpectSame(a, to);
  FlipByte(JoinPath(b, mb.pieces(0).file()), mb.pieces(0).byte_offset());  // mended
  ASSERT_TRUE(CopyCheckpoint(b, to, overwrite).ok());
  ExpectSame(b, to);
}

TEST(CheckpointCopyTest, AnUnknownSchemeIsRefusedNamingTheUrl) {
  absl::StatusOr<CopyReport> report = CopyCheckpoint("nope://x/y", TestDir("copy-scheme"));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("nope://x/y"));
}

}  // namespace
}  // namespace ckpt
