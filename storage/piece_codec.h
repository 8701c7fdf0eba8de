// Lossless compression of a stored piece's bytes (issue 40): the piece is cut into fixed-size
// chunks of raw bytes, each encoded on its own so a ranged read decodes only the chunks it needs.
// Floating-point pieces are byte-grouped first: each element is rotated left by one bit (the sign
// moves to the lowest bit, so the exponent fills the top byte, as ZipNN does), then byte j of
// every element goes to plane j; each plane is zstd-compressed, or stored raw when zstd does not
// shrink it. Other dtypes are zstd-compressed whole, or stored raw.
//
// A frame (the stored bytes of one piece) is self-describing:
//   header, 32 bytes little-endian: magic "CKPZ", version u8 (1), codec u8, element width u8,
//     reserved u8 (0), chunk_bytes u32, num_chunks u32, raw_bytes u64, XXH3-64 of the header's
//     first 24 bytes and the index;
//   index, 16 bytes per chunk: stored bytes u32, flags u32 (bit 0: stored raw), XXH3-64 of the
//     chunk's raw bytes;
//   the chunks, in order. A byte-grouped chunk begins with one u32 per plane (its stored size,
//     the top bit set when the plane is stored raw), then the planes, then the n % width tail
//     bytes of the chunk as they are.
// The piece's raw checksum (StoredPiece.raw_xxh3_64) is RangeChecksum of the chunks' XXH3-64.
//
// Pure: no I/O, threads or logging. Decoding is hostile-input safe: every size is checked against
// what the caller expects (from the manifest) before anything is allocated or written; a corrupt
// or truncated frame is DataLoss naming `what` (the caller's file and piece).
#ifndef CKPT_STORAGE_PIECE_CODEC_H_
#define CKPT_STORAGE_PIECE_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/dtype.h"

namespace ckpt {

// How a piece's bytes are stored. Values are the manifest's (StoredPiece.codec) and the frame's.
enum class PieceCodec : uint8_t {
  kNone = 0,           // raw bytes, no frame
  kZstd = 1,           // chunks zstd-compressed whole
  kByteGroupZstd = 2,  // chunks byte-grouped (sign-rotated), each plane zstd-compressed
};

// "none", "zstd", "bytegroup-zstd".
absl::string_view PieceCodecName(PieceCodec codec);
// The codec a valid manifest value names; InvalidArgument for others.
absl::StatusOr<PieceCodec> PieceCodecFromInt(int64_t value);

// The codec a compressed save uses for a dtype: byte-grouping for floating-point types of
// 2, 4 or 8 bytes (and C64 as pairs of F32), plain zstd for the rest.
PieceCodec CodecForDType(DType dtype);
// The element width byte-grouping uses for a dtype (1 when it does not group).
int ElementWidthFor(DType dtype);

inline constexpr int64_t kFrameHeaderBytes = 32;
inline constexpr int64_t kFrameIndexEntryBytes = 16;
inline constexpr int64_t kDefaultCodecChunkBytes = 128 << 10;
inline constexpr int64_t kMaxCodecChunkBytes = 64 << 20;

// Parameters of an encode.
struct CodecParams {
  PieceCodec codec = PieceCodec::kByteGroupZstd;
  int element_width = 1;                          // 1, 2, 4 or 8; kZstd uses 1
  int64_t chunk_bytes = kDefaultCodecChunkBytes;  // 1 .. kMaxCodecChunkBytes
  // zstd level; 0 (automatic): each byte-grouped plane at kPlaneLevel, or at level 1 where a
  // probe of its first bytes shows LZ matching pays; level 1 for kZstd. Literals are always
  // Huffman-coded.
  int level = 0;
};

// The entropy-stage level of byte-grouped planes: zstd's fastest match finding with
// Huffman-coded literals, which on the exponent bytes of trained weights is at their order-0
// entropy and several times faster than level 1 (MiniLM's bf16 exponent bytes: 33.3% kept at
// an entropy of 33.3%; level 1 keeps 36.3%).
inline constexpr int kPlaneLevel = -1000;

// Frame size bound for `raw_bytes` of raw data: what a frame may take at most.
int64_t MaxFrameBytes(int64_t raw_bytes, const CodecParams& params);
// Bytes of header + index for `raw_bytes` in chunks of `chunk_bytes`.
int64_t FrameIndexBytes(int64_t raw_bytes, int64_t chunk_bytes);

// Reusable zstd contexts and scratch buffers; one per thread.
class CodecScratch {
 public:
  CodecScratch();
  ~CodecScratch();
  CodecScratch(const CodecScratch&) = delete;
  CodecScratch& operator=(const CodecScratch&) = delete;
  struct State;
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// One encoded chunk.
struct EncodedChunk {
  std::string bytes;
  uint32_t flags = 0;
  uint64_t raw_xxh3 = 0;
  int64_t raw_bytes = 0;
};

// Encodes one chunk of `n` raw bytes.
EncodedChunk EncodeChunk(const char* raw, int64_t n, const CodecParams& params,
                         CodecScratch& scratch);
// The same into `out`, whose buffer is reused (a writer that encodes many chunks allocates
// nothing once its buffers have grown).
void EncodeChunkInto(const char* raw, int64_t n, const CodecParams& params, CodecScratch& scratch,
                     EncodedChunk* out);

// A chunk's entry in a frame's index.
struct FrameEntry {
  uint32_t stored_bytes = 0;
  uint32_t flags = 0;
  uint64_t raw_xxh3 = 0;
};

// The frame's header and index (FrameIndexBytes(raw_bytes, params.chunk_bytes) bytes) for
// chunks `entries` (in order) encoding `raw_bytes` raw bytes with `params`: what precedes the
// chunks' stored bytes. A writer that streams the chunks writes it last, in front of them.
std::string EncodeFrameHead(const CodecParams& params, int64_t raw_bytes,
                            const std::vector<FrameEntry>& entries);

// The frame of `chunks` (in order) encoding `raw_bytes` raw bytes with `params`.
std::string AssembleFrame(const CodecParams& params, int64_t raw_bytes,
                          const std::vector<EncodedChunk>& chunks);

// An encoded piece: its frame and the raw checksum the manifest records.
struct EncodedPiece {
  std::string frame;
  uint64_t raw_xxh3 = 0;
};
// Encodes `n` raw bytes, one chunk after another. InvalidArgument for bad params.
absl::StatusOr<EncodedPiece> EncodePiece(const void* raw, int64_t n, const CodecParams& params);
absl::Status ValidateCodecParams(const CodecParams& params);

// A piece's frame and what its manifest record says of it (StoredPiece.codec and after).
struct PackedPiece {
  PieceCodec codec = PieceCodec::kNone;
  int64_t chunk_bytes = 0;
  uint64_t raw_xxh3 = 0;
  std::string frame;
};

// The compression a save asks for (SaveOptions.compression, ckptctl --compression).
struct CompressionOptions {
  bool enabled = false;
  int level = 0;  // zstd level; 0: the codec's default (CodecParams.level)
  int64_t chunk_bytes = kDefaultCodecChunkBytes;
  int threads = 0;  // encode threads; 0: one per CPU
};

// Parses a compression spec: "" or "none" (off), "zstd" (default levels) or "zstd:<level>"
// (-1000..19, not 0).
// InvalidArgument naming the spec otherwise.
absl::StatusOr<CompressionOptions> ParseCompression(absl::string_view spec);
// The spec ParseCompression reads back: "none", "zstd" or "zstd:<level>".
std::string CompressionSpec(const CompressionOptions& options);

// The "ckpt_compression" metadata of a data file holding compressed pieces.
inline constexpr char kPackedEntriesNote[] =
    "uint8 entries are ckpt piece codec frames (byte-grouped zstd), not tensors; read with ckpt";

// What the manifest says about a stored piece, checked against a frame before decoding.
struct FrameExpect {
  PieceCodec codec = PieceCodec::kNone;
  int64_t raw_bytes = 0;
  int64_t stored_bytes = 0;
  int64_t chunk_bytes = 0;
};

// One chunk of a parsed frame.
struct FrameChunk {
  int64_t stored_offset = 0;  // from the frame's start
  int64_t stored_bytes = 0;
  int64_t raw_offset = 0;
  int64_t raw_bytes = 0;
  uint32_t flags = 0;
  uint64_t raw_xxh3 = 0;
};

// A parsed, checked frame header and index.
struct FrameIndex {
  PieceCodec codec = PieceCodec::kNone;
  int element_width = 1;
  int64_t chunk_bytes = 0;
  int64_t raw_bytes = 0;
  std::vector<FrameChunk> chunks;
  // RangeChecksum of the chunks' raw XXH3-64: StoredPiece.raw_xxh3_64.
  uint64_t RawChecksum() const;
};

// Parses the header and index at the start of `prefix` (at least FrameIndexBytes(expect...)
// bytes) and checks them against `expect`: codec, raw size, chunk size, chunk count, each
// chunk's raw size, and that the chunks fill exactly expect.stored_bytes. InvalidArgument when
// `expect` itself is impossible, DataLoss naming `what` when the frame disagrees or is corrupt.
absl::StatusOr<FrameIndex> ParseFrameIndex(absl::string_view prefix, const FrameExpect& expect,
                                           absl::string_view what);

// Decodes chunk `c` of `index` from its stored bytes `stored` (exactly chunks[c].stored_bytes)
// into `dest` (chunks[c].raw_bytes). With `verify`, the decoded bytes' XXH3-64 must match the
// index. DataLoss naming `what` and the chunk for anything corrupt.
absl::Status DecodeChunk(const FrameIndex& index, int c, absl::string_view stored, char* dest,
                         bool verify, CodecScratch& scratch, absl::string_view what);

// Parses and decodes a whole frame into `dest` (expect.raw_bytes), checking every chunk's raw
// checksum with `verify`.
absl::Status DecodePiece(absl::string_view frame, const FrameExpect& expect, void* dest,
                         bool verify, absl::string_view what);

}  // namespace ckpt

#endif  // CKPT_STORAGE_PIECE_CODEC_H_
