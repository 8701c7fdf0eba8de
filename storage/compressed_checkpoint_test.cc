// Compressed checkpoints (storage/piece_codec.h) written with WriteOptions.compression and read
// through CheckpointReader: the manifest records, transparent whole and ranged reads, verify,
// and corruption of the stored bytes or the records refused as DataLoss naming file and tensor.
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/piece_codec.h"
#include "storage/safetensors.h"
#include "storage/test_dir.h"
#include "storage/verify.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

bool WriteStringToFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

Region Box(std::vector<int64_t> off, std::vector<int64_t> len) {
  return Region{std::move(off), std::move(len), std::nullopt};
}

// A weight-like bf16 tensor, a f32 one with NaN payloads and subnormals, and int64 counters.
struct Contents {
  std::vector<std::string> bytes;
  CheckpointContents c;
};

Contents MakeContents() {
  Contents out;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::string bf16(96 * 1000 * 2, '\0'), f32(33 * 7 * 4, '\0'), i64(10 * 8, '\0');
  for (size_t i = 0; i < bf16.size(); i += 2) {
    const float f = dist(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint16_t h = static_cast<uint16_t>(b >> 16);
    std::memcpy(&bf16[i], &h, 2);
  }
  const uint32_t specials[] = {0x7FC00123, 0xFF800001, 0x80000000, 0x00000001, 0x807FFFFF};
  for (size_t i = 0; i < f32.size(); i += 4) {
    const uint32_t v = i % 12 == 0 ? specials[(i / 12) % 5] : static_cast<uint32_t>(rng());
    std::memcpy(&f32[i], &v, 4);
  }
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<char>(i % 3);
  out.bytes = {bf16, f32, i64};
  out.c.tensors = {
      {"w", DType::kBF16, {96, 1000}}, {"f", DType::kF32, {33, 7}}, {"step", DType::kI64, {10}}};
  const std::string& w = out.bytes[0];
  DataFilePlan plan0{0,
                     {{"w", Box({0, 0}, {48, 1000}), w.data(), 48 * 1000 * 2},
                      {"f", Box({0, 0}, {33, 7}), out.bytes[1].data(), 33 * 7 * 4}}};
  DataFilePlan plan1{1,
                     {{"w", Box({48, 0}, {48, 1000}), w.data() + 48 * 1000 * 2, 48 * 1000 * 2},
                      {"step", Box({0}, {10}), out.bytes[2].data(), 80}}};
  out.c.files = {plan0, plan1};
  return out;
}

WriteOptions Compressed() {
  WriteOptions o;
  o.compression.enabled = true;
  o.compression.chunk_bytes = 4096;  // many chunks per piece, so ranges cross them
  o.checksum_block_bytes = 8192;     // and checksum blocks
  return o;
}

TEST(CompressedCheckpointTest, PiecesRecordTheirCodecAndReadBackBitExact) {
  const std::string dir = TestDir("compressed_roundtrip");
  const Contents in = MakeContents();
  const std::string path = JoinPath(dir, "ckpt");
  absl::StatusOr<pb::Manifest> m = WriteCheckpoint(path, in.c, Compressed());
  ASSERT_TRUE(m.ok()) << m.status();
  int64_t raw = 0, stored = 0;
  for (const pb::StoredPiece& p : m->pieces()) {
    EXPECT_NE(p.codec(), 0u) << p.key();
    EXPECT_EQ(p.codec_chunk_bytes(), 4096);
    raw += p.byte_length();
    stored += p.stored_length();
  }
  EXPECT_LT(stored, raw * 8 / 10);  // the bf16 weights shrink
  absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t t = 0; t < in.c.tensors.size(); ++t) {
    const TensorMeta& meta = in.c.tensors[t];
    std::string out(in.bytes[t].size(), '\0');
    Region whole{std::vector<int64_t>(meta.global_shape.size(), 0), meta.global_shape,
                 std::nullopt};
    ASSERT_TRUE((*r)->ReadRegion(meta.key, whole, out.data()).ok()) << meta.key;
    EXPECT_TRUE(out == in.bytes[t]) << meta.key;
  }
  // A range inside one piece, crossing chunk boundaries and starting mid-chunk.
  std::string part(5 * 1000 * 2, '\0');
  ASSERT_TRUE((*r)->ReadRegion("w", Box({50, 0}, {5, 1000}), part.data()).ok());
  EXPECT_TRUE(part == in.bytes[0].substr(50 * 1000 * 2, part.size()));
  // A column: many short ranges of both pieces.
  std::string col(96 * 3 * 2, '\0');
  ASSERT_TRUE((*r)->ReadRegion("w", Box({0, 997}, {96, 3}), col.data()).ok());
  for (int row = 0; row < 96; ++row) {
    EXPECT_EQ(col.substr(row * 6, 6), in.bytes[0].substr((row * 1000 + 997) * 2, 6)) << row;
  }
  absl::StatusOr<VerifyReport> v = VerifyCheckpoint(path, IoOptions());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

TEST(CompressedCheckpointTest, DataFilesHoldFramesAsUint8EntriesAndSaySo) {
  const std::string dir = TestDir("compressed_header");
  const Contents in = MakeContents();
  absl::StatusOr<pb::Manifest> m = WriteCheckpoint(JoinPath(dir, "ckpt"), in.c, Compressed());
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<SafetensorsHeader> h = ReadDataFileHeader(JoinPath(dir, "ckpt"), m->files(0));
  ASSERT_TRUE(h.ok()) << h.status();
  for (const SafetensorsEntry& e : h->entries) EXPECT_EQ(e.dtype, DType::kU8) << e.name;
  EXPECT_EQ(h->metadata.count("ckpt_compression"), 1u);
}

TEST(CompressedCheckpointTest, ACorruptStoredByteIsDataLossNamingFileAndTensor) {
  const std::string dir = TestDir("compressed_corrupt");
  const Contents in = MakeContents();
  const std::string path = JoinPath(dir, "ckpt");
  absl::StatusOr<pb::Manifest> m = WriteCheckpoint(path, in.c, Compressed());
  ASSERT_TRUE(m.ok()) << m.status();
  const pb::StoredPiece& w0 = m->pieces(0);
  ASSERT_EQ(w0.key(), "w");
  const std::string file = JoinPath(path, w0.file());
  absl::StatusOr<std::string> bytes = ReadWholeFile(file, int64_t{1} << 30);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[w0.byte_offset() + w0.stored_length() / 2] ^= 0x10;
  ASSERT_TRUE(WriteStringToFile(file, bad));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  std::string out(96 * 1000 * 2, '\0');
  absl::Status s = (*r)->ReadRegion("w", Box({0, 0}, {96, 1000}), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("r0_0.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("\"w\""));
  // A reader opened without verification refuses it too when a read asks to verify.
  ReaderOptions unverified;
  unverified.verify_checksums = false;
  ASSERT_TRUE(WriteStringToFile(file, bad));
  r = CheckpointReader::Open(path, unverified);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<PieceRead> reads = {{0, 0, w0.byte_length(), out.data()}};
  s = (*r)->ReadPieces(reads, /*verify=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(CompressedCheckpointTest, RecordsThatDisagreeWithTheFrameAreRefused) {
  const std::string dir = TestDir("compressed_records");
  const Contents in = MakeContents();
  absl::StatusOr<pb::Manifest> m = WriteCheckpoint(JoinPath(dir, "ckpt"), in.c, Compressed());
  ASSERT_TRUE(m.ok()) << m.status();
  pb::Manifest bad = *m;
  bad.mutable_pieces(0)->set_codec(9);
  EXPECT_THAT(ValidateManifest(bad).message(), HasSubstr("not a valid compressed piece"));
  bad = *m;
  bad.mutable_pieces(0)->set_stored_length(40);  // cannot hold the index of 24 chunks
  EXPECT_EQ(ValidateManifest(bad).code(), absl::StatusCode::kDataLoss);
  bad = *m;
  bad.mutable_pieces(2)->set_codec(0);  // stored_length left set
  EXPECT_FALSE(ValidateManifest(bad).ok());
  // The raw checksum is checked against the frame's chunk checksums.
  std::vector<StoredPieceRead> reads;
  pb::StoredPiece p = m->pieces(0);
  p.set_raw_xxh3_64(p.raw_xxh3_64() ^ 1);
  std::string out(p.byte_length(), '\0');
  absl::Status s = ReadStoredPieces(JoinPath(dir, "ckpt"), m->checksum_block_bytes(),
                                    {{&p, 100, 5000, out.data()}}, /*verify=*/true, IoOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("raw"));
  p = m->pieces(0);
  p.set_byte_length(p.byte_length() + 2);  // claims more raw bytes than the frame holds
  out.resize(p.byte_length());
  s = ReadStoredPieces(JoinPath(dir, "ckpt"), m->checksum_block_bytes(),
                       {{&p, 0, p.byte_length(), out.data()}}, /*verify=*/false, IoOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

}  // namespace
}  // namespace ckpt
