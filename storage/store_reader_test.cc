// CheckpointReader on a checkpoint in an object store (storage/store_objects.h), against a real
// one-node Swift with s3api (storage/s3/testing): checkpoints written to a directory by the
// writer (plain, with block checksums, compressed) and copied to s3:// read back through Open
// and OpenShare byte for byte as from the directory; a share read without the manifest object;
// a tampered, truncated or missing object named in its error.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "storage/store_objects.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "ckpt-reader-test";
constexpr int64_t kRows = 6, kCols = 1000;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// The binary's server, its bucket made once, and the AWS environment pointing at it (the
// registry's "s3" store and the reader's client both come from the environment, as a user's).
S3TestServer& Server() {
  static S3TestServer* server = &S3TestServer::SharedWithBucket(kBucket);
  return *server;
}

std::unique_ptr<S3Client> Client() { return *S3Client::Create(Server().ClientOptions()); }

// How a test checkpoint is written.
enum class Variant { kPlain, kBlockChecksums, kCompressed };

// "w" (f32, 6 x 1000) in three row pieces over two files, and "b" (bf16, 100), in `dir`; small
// values, so that compression has something to do.
pb::Manifest WriteSource(const std::string& dir, Variant variant, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<std::vector<float>>> rows;
  auto w_rows = [&](int64_t first, int64_t count) {
    rows.push_back(std::make_unique<std::vector<float>>(count * kCols));
    for (float& v : *rows.back()) v = static_cast<float>(rng() % 16);
    return PieceData{"w", Region{{first, 0}, {count, kCols}, std::nullopt}, rows.back()->data(),
                     count * kCols * 4};
  };
  std::vector<uint16_t> b(100);
  for (uint16_t& v : b) v = static_cast<uint16_t>(rng() % 64);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kF32, {kRows, kCols}},
                      TensorMeta{"b", DType::kBF16, {100}}};
  contents.files = {
      DataFilePlan{0, {w_rows(0, 2), w_rows(2, 2)}},
      DataFilePlan{
          1, {w_rows(4, 2), PieceData{"b", Region{{0}, {100}, std::nullopt}, b.data(), 200}}}};
  WriteOptions options;
  if (variant == Variant::kBlockChecksums) options.checksum_block_bytes = 4096;
  if (variant == Variant::kCompressed) {
    options.compression.enabled = true;
    options.compression.chunk_bytes = 4096;
  }
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(dir, contents, options);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return manifest.ok() ? *manifest : pb::Manifest();
}

// A checkpoint written to TestDir(name)/ckpt and copied to s3://kBucket/name: (dir, url).
std::pair<std::string, std::string> WriteAndUpload(const std::string& name, Variant variant) {
  Server();
  const std::string dir = JoinPath(TestDir(name), "ckpt");
  WriteSource(dir, variant, 7);
  const std::string url = absl::StrCat("s3://", kBucket, "/", name);
  absl::StatusOr<CopyReport> copied = CopyCheckpoint(dir, url);
  EXPECT_TRUE(copied.ok()) << copied.status();
  return {dir, url};
}

// The key of data object `name` of the checkpoint committed at s3://kBucket/`prefix`.
std::string DataKey(const std::string& prefix, const std::string& name) {
  absl::StatusOr<pb::Manifest> manifest =
      ReadStoreManifest(absl::StrCat("s3://", kBucket, "/", prefix), Deadline());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return absl::StrCat(prefix, "/", manifest->object_generation(), "/", name);
}

// Regions read in the tests: whole tensors, a box across the three row pieces, one element.
std::vector<std::pair<std::string, Region>> Regions() {
  return {{"w", Region{{0, 0}, {kRows, kCols}, std::nullopt}},
          {"w", Region{{1, 100}, {4, 601}, std::nullopt}},
          {"w", Region{{5, 999}, {1, 1}, std::nullopt}},
          {"b", Region{{0}, {100}, std::nullopt}},
          {"b", Region{{37}, {21}, std::nullopt}}};
}

int64_t RegionBytes(const std::string& key, const Region& region) {
  return region.NumElements() * (key == "w" ? 4 : 2);
}

// Reads every region of Regions() that `reader` holds through one ReadRegions call.
absl::StatusOr<std::vector<std::string>> ReadAll(const CheckpointReader& reader,
                                                 const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  std::vector<CheckpointReader::RegionRead> reads;
  for (const auto& [key, region] : Regions()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    out.emplace_back(RegionBytes(key, region), '\xee');
  }
  size_t i = 0;
  for (const auto& [key, region] : Regions()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    reads.push_back({key, region, out[i++].data()});
  }
  absl::Status read = reader.ReadRegions(reads);
  if (!read.ok()) return read;
  return out;
}

class StoreReaderTest : public ::testing::TestWithParam<Variant> {};

TEST_P(StoreReaderTest, OpenOnAnS3UrlReadsTheSameBytesAsTheDirectory) {
  const std::string name = absl::StrCat("open-", static_cast<int>(GetParam()));
  const auto [dir, url] = WriteAndUpload(name, GetParam());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> local = CheckpointReader::Open(dir);
  ASSERT_TRUE(local.ok()) << local.status();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> remote = CheckpointReader::Open(url);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ((*remote)->path(), url);
  ASSERT_NE((*remote)->objects(), nullptr);
  EXPECT_EQ((*local)->objects(), nullptr);
  // The manifest handed on is the directory's: no object generation.
  EXPECT_EQ((*remote)->manifest().SerializeAsString(), (*local)->manifest().SerializeAsString());
  // The variant is what it says: the first piece of "w" is compressed, or has several blocks.
  const pb::StoredPiece& first = (*remote)->manifest().pieces((*remote)->PiecesOf("w")[0]);
  EXPECT_EQ(first.codec() != 0, GetParam() == Variant::kCompressed);
  if (GetParam() == Variant::kBlockChecksums) {
    EXPECT_GT(first.block_xxh3_size(), 1);
  }
  auto want = ReadAll(**local, {"w", "b"});
  auto got = ReadAll(**remote, {"w", "b"});
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *want);
  // Partial ranges of each stored piece, unverified and verified.
  for (bool verify : {false, true}) {
    for (int p = 0; p < (*local)->manifest().pieces_size(); ++p) {
      const int64_t len = (*local)->manifest().pieces(p).byte_length();
      std::string a(len - 3, '\0'), b(len - 3, '\1');
      ASSERT_TRUE((*local)->ReadPieces({{p, 1, len - 2, a.data()}}, verify).ok());
      absl::Status s = (*remote)->ReadPieces({{p, 1, len - 2, b.data()}}, verify);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(a, b) << "piece " << p;
    }
  }
}

TEST_P(StoreReaderTest, OpenShareReadsTheSharesObjectsWithoutTheManifestObject) {
  const std::string name = absl::StrCat("share-", static_cast<int>(GetParam()));
  const auto [dir, url] = WriteAndUpload(name, GetParam());
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  // The share of "b" alone: its piece, tensor and file, and the generation.
  pb::Manifest share;
  share.set_format_version(manifest->format_version());
  share.set_checksum_block_bytes(manifest->checksum_block_bytes());
  share.set_object_generation(manifest->object_generation());
  for (const pb::StoredPiece& p : manifest->pieces()) {
    if (p.key() != "b") continue;
    *share.add_pieces() = p;
    for (const pb::DataFile& f : manifest->files()) {
      if (f.name() == p.file()) *share.add_files() = f;
    }
  }
  for (const pb::TensorMeta& t : manifest->tensors()) {
    if (t.key() == "b") *share.add_tensors() = t;
  }
  ASSERT_EQ(share.tensors_size(), 1);
  // Without the manifest object the checkpoint is gone for Open, not for a share's reader.
  ASSERT_TRUE(Client()->DeleteObject(kBucket, name + "/manifest.pb", Deadline()).ok());
  EXPECT_TRUE(absl::IsNotFound(CheckpointReader::Open(url).status()));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> remote =
      CheckpointReader::OpenShare(url, share);
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> local = CheckpointReader::Open(dir);
  ASSERT_TRUE(local.ok()) << local.status();
  auto want = ReadAll(**local, {"b"});
  auto got = ReadAll(**remote, {"b"});
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *want);
}

INSTANTIATE_TEST_SUITE_P(Variants, StoreReaderTest,
                         ::testing::Values(Variant::kPlain, Variant::kBlockChecksums,
                                           Variant::kCompressed),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           switch (info.param) {
                             case Variant::kPlain:
                               return "Plain";
                             case Variant::kBlockChecksums:
                               return "BlockChecksums";
                             case Variant::kCompressed:
                               return "Compressed";
                           }
                           return "Unknown";
                         });

TEST(StoreReaderErrorsTest, AShareWithoutAnObjectGenerationIsInvalidArgumentNamingTheUrl) {
  const auto [dir, url] = WriteAndUpload("no-generation", Variant::kPlain);
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->clear_object_generation();
  absl::Status s = CheckpointReader::OpenShare(url, *manifest).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(url));
}

TEST(StoreReaderErrorsTest, ATamperedObjectIsDataLossNamingIt) {
  const auto [dir, url] = WriteAndUpload("tampered", Variant::kBlockChecksums);
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const pb::DataFile& file = manifest->files(1);  // w rows 4-5, then b
  const std::string key = DataKey("tampered", file.name());
  std::string bytes = *ReadWholeFile(JoinPath(dir, file.name()), 1 << 30);
  bytes[bytes.size() - 7] ^= 0x20;  // inside b, the last piece
  ASSERT_TRUE(Client()->PutObject(kBucket, key, bytes, Deadline()).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(url);
  ASSERT_TRUE(reader.ok()) << reader.status();  // same size, same header
  std::vector<char> w(kRows * kCols * 4);
  EXPECT_TRUE(
      (*reader)->ReadRegion("w", Region{{0, 0}, {kRows, kCols}, std::nullopt}, w.data()).ok());
  std::vector<char> b(200);
  absl::Status s = (*reader)->ReadRegion("b", Region{{0}, {100}, std::nullopt}, b.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(key));
  EXPECT_THAT(s.message(), HasSubstr("tensor \"b\""));
}

TEST(StoreReaderErrorsTest, ATruncatedObjectIsDataLossNamingIt) {
  const auto [dir, url] = WriteAndUpload("truncated", Variant::kPlain);
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const pb::DataFile& file = manifest->files(0);
  const std::string key = DataKey("truncated", file.name());
  std::string bytes = *ReadWholeFile(JoinPath(dir, file.name()), 1 << 30);
  bytes.resize(bytes.size() - 100);
  ASSERT_TRUE(Client()->PutObject(kBucket, key, bytes, Deadline()).ok());
  absl::Status s = CheckpointReader::Open(url).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(key));
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST(StoreReaderErrorsTest, AMissingObjectOrCheckpointIsNotFoundNamingIt) {
  const auto [dir, url] = WriteAndUpload("missing", Variant::kPlain);
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string key = DataKey("missing", manifest->files(1).name());
  ASSERT_TRUE(Client()->DeleteObject(kBucket, key, Deadline()).ok());
  absl::Status s = CheckpointReader::Open(url).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(key));

  const std::string nothing = absl::StrCat("s3://", kBucket, "/never-written");
  s = CheckpointReader::Open(nothing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(nothing));
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// ReadObjectRanges coalesces nearby ranges of an object into one GET and cuts long ones: random
// batches (overlapping, adjacent, far apart, longer than a GET, empty, over two objects) read
// exactly the bytes a brute-force copy of the whole object gives.
TEST(StoreObjectRangesTest, CoalescedAndCutRangesReadTheSameBytesAsTheWholeObjects) {
  const auto [dir, url] = WriteAndUpload("ranges", Variant::kPlain);
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  absl::StatusOr<std::unique_ptr<StoreObjects>> objects = StoreObjects::Open(url, *manifest);
  ASSERT_TRUE(objects.ok()) << objects.status();
  std::vector<std::string> names, whole;
  for (const pb::DataFile& f : manifest->files()) {
    names.push_back(f.name());
    whole.push_back(*ReadWholeFile(JoinPath(dir, f.name()), 1 << 30));
  }
  // An object of 2.5 GETs beside them, so that long ranges are cut into several.
  std::string big(kMinObjectGetBytes * 5 / 2, '\0');
  std::mt19937 fill(7);
  for (char& c : big) c = static_cast<char>(fill());
  ASSERT_TRUE(
      Client()->PutObject(kBucket, DataKey("ranges", "data/big.bin"), big, Deadline()).ok());
  names.push_back("data/big.bin");
  whole.push_back(big);
  IoOptions io;
  io.buffer_bytes = 1 << 20;  // below the smallest GET: kMinObjectGetBytes rules
  std::mt19937 rng(43);
  for (int round = 0; round < 8; ++round) {
    std::vector<RangeRead> reads(1 + rng() % 16);
    std::vector<std::string> got(reads.size());
    for (size_t i = 0; i < reads.size(); ++i) {
      const size_t f = rng() % names.size();
      const int64_t size = static_cast<int64_t>(whole[f].size());
      reads[i].path = names[f];
      reads[i].offset = static_cast<int64_t>(rng() % size);
      const int64_t most = size - reads[i].offset;
      reads[i].length = rng() % 4 == 0 ? most : static_cast<int64_t>(rng() % (1 + most / 8));
      got[i].assign(static_cast<size_t>(reads[i].length), '\0');
      reads[i].dest = got[i].data();
    }
    ASSERT_TRUE(ReadObjectRanges(**objects, reads, io, Deadline()).ok());
    for (size_t i = 0; i < reads.size(); ++i) {
      const size_t f = std::find(names.begin(), names.end(), reads[i].path) - names.begin();
      ASSERT_EQ(got[i], whole[f].substr(reads[i].offset, reads[i].length))
          << "round " << round << " range " << i;
    }
  }
}

}  // namespace
}  // namespace ckpt
