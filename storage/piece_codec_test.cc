#include "storage/piece_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/checksum.h"

namespace ckpt {
namespace {

// Bytes of `n` elements of `dtype` mixing random bits with special values: NaNs with payloads
// (quiet and signalling, both signs), infinities, -0.0, subnormals, the extremes.
std::string SpecialBytes(DType dtype, int64_t bytes, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(bytes, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  const int w = static_cast<int>(DTypeSize(dtype));
  std::vector<uint64_t> specials;
  if (w == 2)
    specials = {0x7FC1, 0xFF81, 0x7F81, 0x8000, 0x0001, 0x807F,
                0x7F80, 0xFF80, 0x7E01, 0xFE00, 0x03FF, 0x8001};
  if (w == 4)
    specials = {0x7FC00001, 0xFFBFFFFF, 0x7F800001, 0x80000000, 0x00000001,
                0x807FFFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00800000};
  if (w == 8)
    specials = {0x7FF8000000000001, 0xFFF0000000000001, 0x8000000000000000,
                0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x7FF0000000000000};
  if (w == 1) specials = {0x7F, 0xFF, 0x80, 0x01, 0x00, 0x78};
  for (int64_t i = 0; i + w <= bytes; i += w) {
    if (rng() % 3 == 0) {
      const uint64_t v = specials[rng() % specials.size()];
      std::memcpy(&out[i], &v, w);
    }
  }
  return out;
}

// Trained-weight-like bytes: small normally distributed values of `dtype` (F32/BF16/F16/F64).
std::string WeightBytes(DType dtype, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::string out;
  for (int64_t i = 0; i < count; ++i) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (dtype == DType::kF32) out.append(reinterpret_cast<const char*>(&bits), 4);
    if (dtype == DType::kBF16) {
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
    if (dtype == DType::kF64) {
      const double d = f;
      out.append(reinterpret_cast<const char*>(&d), 8);
    }
  }
  return out;
}

CodecParams ParamsFor(DType dtype, int64_t chunk) {
  CodecParams p;
  p.codec = CodecForDType(dtype);
  p.element_width = p.codec == PieceCodec::kByteGroupZstd ? ElementWidthFor(dtype) : 1;
  p.chunk_bytes = chunk;
  return p;
}

FrameExpect ExpectFor(const CodecParams& p, int64_t raw, const std::string& frame) {
  return FrameExpect{p.codec, raw, static_cast<int64_t>(frame.size()), p.chunk_bytes};
}

// Encodes, checks the frame bound and the raw checksum, decodes and compares bit for bit.
void RoundTrip(DType dtype, const std::string& raw, int64_t chunk) {
  SCOPED_TRACE(::testing::Message()
               << DTypeName(dtype) << " " << raw.size() << " bytes, chunk " << chunk);
  const CodecParams p = ParamsFor(dtype, chunk);
  absl::StatusOr<EncodedPiece> enc = EncodePiece(raw.data(), raw.size(), p);
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_LE(static_cast<int64_t>(enc->frame.size()), MaxFrameBytes(raw.size(), p));
  StreamingChecksum whole(chunk);
  whole.Update(raw.data(), raw.size());
  EXPECT_EQ(enc->raw_xxh3, whole.Whole());
  std::string back(raw.size(), '\x5A');
  ASSERT_TRUE(DecodePiece(enc->frame, ExpectFor(p, raw.size(), enc->frame), back.data(),
                          /*verify=*/true, "piece")
                  .ok());
  EXPECT_TRUE(back == raw) << "decoded bytes differ";
}

TEST(PieceCodecTest, EveryDTypeRoundTripsBitExactWithSpecialValuesAndOddSizes) {
  for (DType dtype : kAllDTypes) {
    const int64_t w = DTypeSize(dtype);
    for (int64_t bytes : {int64_t{0}, int64_t{1}, w - 1, w, w + 1, 7 * w + 3, int64_t{1000},
                          int64_t{4097}, int64_t{65536} + 5}) {
      if (bytes < 0) continue;
      const std::string raw = SpecialBytes(dtype, bytes, static_cast<uint32_t>(bytes * 31 + w));
      for (int64_t chunk : {int64_t{1}, w, w + 1, int64_t{4096}, bytes - 1, bytes, bytes + 1}) {
        if (chunk < 1) continue;
        if (chunk < 64 && bytes > 4097) continue;  // millions of chunks: slow, no new edge
        RoundTrip(dtype, raw, chunk);
      }
    }
  }
}

TEST(PieceCodecTest, CompressibleWeightsRoundTripAndShrink) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    const std::string raw = WeightBytes(dtype, 300000, 7);
    RoundTrip(dtype, raw, 1 << 16);
    const CodecParams grouped = ParamsFor(dtype, 1 << 20);
    CodecParams plain = grouped;
    plain.codec = PieceCodec::kZstd;
    plain.element_width = 1;
    const int64_t g = EncodePiece(raw.data(), raw.size(), grouped)->frame.size();
    const int64_t z = EncodePiece(raw.data(), raw.size(), plain)->frame.size();
    // Byte-grouping pays: the grouped frame is smaller than zstd of the interleaved bytes.
    EXPECT_LT(g, z) << DTypeName(dtype);
    EXPECT_LT(g, static_cast<int64_t>(raw.size() * 0.9)) << DTypeName(dtype);
  }
}

TEST(PieceCodecTest, IncompressibleChunksAreStoredRawWithinTheBound) {
  std::mt19937_64 rng(3);
  std::string raw(1 << 18, '\0');
  for (auto& c : raw) c = static_cast<char>(rng());
  CodecParams p = ParamsFor(DType::kU8, 1 << 16);
  absl::StatusOr<EncodedPiece> enc = EncodePiece(raw.data(), raw.size(), p);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(static_cast<int64_t>(enc->frame.size()), MaxFrameBytes(raw.size(), p));
}

TEST(PieceCodecTest, BadParamsAreInvalidArgument) {
  CodecParams p;
  p.element_width = 3;
  EXPECT_EQ(EncodePiece("abc", 3, p).status().code(), absl::StatusCode::kInvalidArgument);
  p = CodecParams();
  p.chunk_bytes = kMaxCodecChunkBytes + 1;
  EXPECT_EQ(EncodePiece("abc", 3, p).status().code(), absl::StatusCode::kInvalidArgument);
  p = CodecParams();
  p.codec = PieceCodec::kNone;
  EXPECT_EQ(EncodePiece("abc", 3, p).status().code(), absl::StatusCode::kInvalidArgument);
}

class CorruptFrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    raw_ = WeightBytes(DType::kBF16, 20000, 11);
    params_ = ParamsFor(DType::kBF16, 8192);
    frame_ = EncodePiece(raw_.data(), raw_.size(), params_)->frame;
  }
  absl::Status Decode(const std::string& frame, FrameExpect e, bool verify = true) {
    out_.assign(raw_.size(), '\0');
    return DecodePiece(frame, e, out_.data(), verify, "data/r0_0.safetensors piece \"w\"");
  }
  FrameExpect Expect() const { return ExpectFor(params_, raw_.size(), frame_); }
  std::string raw_, frame_, out_;
  CodecParams params_;
};

TEST_F(CorruptFrameTest, EveryTruncationIsDataLossNamingThePiece) {
  for (size_t n = 0; n < frame_.size(); n += (n < 200 ? 1 : 97)) {
    const std::string cut = frame_.substr(0, n);
    absl::Status s = Decode(cut, Expect());  // the manifest's size, a shorter file
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << n;
    FrameExpect e = Expect();
    e.stored_bytes = n;  // the manifest agrees with the cut frame
    s = Decode(cut, e);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << n;
    EXPECT_NE(s.message().find("piece \"w\""), std::string::npos) << s;
  }
}

// A flip the decoder cannot see (a zstd header bit that changes nothing decoded) must still
// give the right bytes; the stored-bytes checksum of the manifest catches those on read.
TEST_F(CorruptFrameTest, EveryFlippedByteIsRefusedOrHarmlessWhenVerifyingAndNeverCrashes) {
  int refused = 0;
  for (size_t i = 0; i < frame_.size(); i += (i < 300 ? 1 : 11)) {  // header, index, planes
    std::string bad = frame_;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    absl::Status s = Decode(bad, Expect());
    if (s.ok()) {
      EXPECT_TRUE(out_ == raw_) << "byte " << i << " decoded to other bytes without an error";
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i;
      ++refused;
    }
    (void)Decode(bad, Expect(), /*verify=*/false);  // may decode other bytes; must not crash
  }
  EXPECT_GT(refused, (300 + static_cast<int>(frame_.size()) / 11) * 9 / 10);
}

TEST_F(CorruptFrameTest, ClaimsLargerThanTheManifestAreRefusedBeforeAllocating) {
  FrameExpect e = Expect();
  e.raw_bytes = int64_t{1} << 60;  // an index of 2^40 chunks would not fit the stored bytes
  std::string out;
  absl::StatusOr<FrameIndex> index = ParseFrameIndex(frame_, e, "p");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  e = Expect();
  e.raw_bytes = raw_.size() - 1;  // the frame claims more than the manifest
  EXPECT_EQ(ParseFrameIndex(frame_, e, "p").status().code(), absl::StatusCode::kDataLoss);
  e = Expect();
  e.chunk_bytes = 4096;
  EXPECT_EQ(ParseFrameIndex(frame_, e, "p").status().code(), absl::StatusCode::kDataLoss);
  e = Expect();
  e.codec = PieceCodec::kZstd;
  EXPECT_EQ(ParseFrameIndex(frame_, e, "p").status().code(), absl::StatusCode::kDataLoss);
  e = Expect();
  e.chunk_bytes = kMaxCodecChunkBytes + 1;
  EXPECT_EQ(ParseFrameIndex(frame_, e, "p").status().code(), absl::StatusCode::kInvalidArgument);
  e = Expect();
  e.codec = PieceCodec::kNone;
  EXPECT_EQ(ParseFrameIndex(frame_, e, "p").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CorruptFrameTest, ARangeDecodesOnlyItsChunks) {
  absl::StatusOr<FrameIndex> index = ParseFrameIndex(frame_, Expect(), "p");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->chunks.size(), (raw_.size() + 8191) / 8192);
  EXPECT_EQ(index->RawChecksum(), EncodePiece(raw_.data(), raw_.size(), params_)->raw_xxh3);
  // Chunk 2 alone, from its own stored bytes, even when the others are garbage.
  std::string damaged = frame_;
  const FrameChunk& c2 = index->chunks[2];
  for (int64_t i = index->chunks[0].stored_offset; i < c2.stored_offset; ++i) damaged[i] = 0;
  std::string out(c2.raw_bytes, '\0');
  CodecScratch scratch;
  ASSERT_TRUE(DecodeChunk(*index, 2,
                          absl::string_view(damaged).substr(c2.stored_offset, c2.stored_bytes),
                          out.data(), true, scratch, "p")
                  .ok());
  EXPECT_EQ(out, raw_.substr(c2.raw_offset, c2.raw_bytes));
}

}  // namespace
}  // namespace ckpt
