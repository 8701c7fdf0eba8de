#include "storage/piece_codec.h"

// ZSTD_c_literalCompressionMode is in zstd's experimental API (stable in libzstd 1.5.x); the
// frames it writes are standard zstd frames.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "storage/checksum.h"

namespace ckpt {
namespace {

constexpr char kMagic[4] = {'C', 'K', 'P', 'Z'};
constexpr uint8_t kVersion = 1;
constexpr uint32_t kChunkRaw = 1;           // index flag: the chunk is stored raw
constexpr uint32_t kPlaneRaw = 0x80000000;  // plane size flag: the plane is stored raw
constexpr int64_t kProbeBytes = 16 << 10;

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

bool ValidWidth(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

// Splits m elements of width sizeof(T) at `src` into planes (plane j at dst + j * m), each
// element rotated left by one bit first. Written per width with restrict pointers so the
// compiler vectorizes the loops.
template <typename T>
void GroupPlanes(const char* __restrict src, int64_t m, char* __restrict dst) {
  constexpr int kW = sizeof(T);
  constexpr int kBits = 8 * kW;
  uint8_t* __restrict p[kW];
  for (int j = 0; j < kW; ++j) p[j] = reinterpret_cast<uint8_t*>(dst) + j * m;
  for (int64_t i = 0; i < m; ++i) {
    T v;
    std::memcpy(&v, src + i * kW, kW);
    v = static_cast<T>((v << 1) | (v >> (kBits - 1)));
    p[0][i] = static_cast<uint8_t>(v);
    p[1][i] = static_cast<uint8_t>(v >> 8);
    if constexpr (kW >= 4) {
      p[2][i] = static_cast<uint8_t>(v >> 16);
      p[3][i] = static_cast<uint8_t>(v >> 24);
    }
    if constexpr (kW == 8) {
      p[4][i] = static_cast<uint8_t>(v >> 32);
      p[5][i] = static_cast<uint8_t>(v >> 40);
      p[6][i] = static_cast<uint8_t>(v >> 48);
      p[7][i] = static_cast<uint8_t>(v >> 56);
    }
  }
}

// The inverse of GroupPlanes.
template <typename T>
void UngroupPlanes(const char* __restrict src, int64_t m, char* __restrict dst) {
  constexpr int kW = sizeof(T);
  constexpr int kBits = 8 * kW;
  const uint8_t* __restrict p[kW];
  for (int j = 0; j < kW; ++j) p[j] = reinterpret_cast<const uint8_t*>(src) + j * m;
  for (int64_t i = 0; i < m; ++i) {
    T v = static_cast<T>(p[0][i]) | static_cast<T>(static_cast<T>(p[1][i]) << 8);
    if constexpr (kW >= 4) {
      v |= static_cast<T>(p[2][i]) << 16 | static_cast<T>(p[3][i]) << 24;
    }
    if constexpr (kW == 8) {
      v |= static_cast<T>(p[4][i]) << 32 | static_cast<T>(p[5][i]) << 40 |
           static_cast<T>(p[6][i]) << 48 | static_cast<T>(p[7][i]) << 56;
    }
    v = static_cast<T>((v >> 1) | (v << (kBits - 1)));
    std::memcpy(dst + i * kW, &v, kW);
  }
}

#if defined(__SSE2__)
// SSE2 (every x86-64) for the common widths: 16 elements per step, the scalar loop for the rest.
int64_t Group2Sse2(const char* src, int64_t m, char* dst) {
  const __m128i low = _mm_set1_epi16(0xFF);
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16));
    a = _mm_or_si128(_mm_slli_epi16(a, 1), _mm_srli_epi16(a, 15));
    b = _mm_or_si128(_mm_slli_epi16(b, 1), _mm_srli_epi16(b, 15));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + m + i),
                     _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
  }
  return i;
}

int64_t Ungroup2Sse2(const char* src, int64_t m, char* dst) {
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + m + i));
    __m128i a = _mm_unpacklo_epi8(lo, hi);
    __m128i b = _mm_unpackhi_epi8(lo, hi);
    a = _mm_or_si128(_mm_srli_epi16(a, 1), _mm_slli_epi16(a, 15));
    b = _mm_or_si128(_mm_srli_epi16(b, 1), _mm_slli_epi16(b, 15));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), b);
  }
  return i;
}

int64_t Group4Sse2(const char* src, int64_t m, char* dst) {
  const __m128i low = _mm_set1_epi32(0xFF);
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4 * i + 16 * k));
      v[k] = _mm_or_si128(_mm_slli_epi32(v[k], 1), _mm_srli_epi32(v[k], 31));
    }
    for (int j = 0; j < 4; ++j) {
      __m128i b[4];
      for (int k = 0; k < 4; ++k) b[k] = _mm_and_si128(_mm_srli_epi32(v[k], 8 * j), low);
      const __m128i lo = _mm_packs_epi32(b[0], b[1]);
      const __m128i hi = _mm_packs_epi32(b[2], b[3]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j * m + i), _mm_packus_epi16(lo, hi));
    }
  }
  return i;
}

int64_t Ungroup4Sse2(const char* src, int64_t m, char* dst) {
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    __m128i p[4];
    for (int j = 0; j < 4; ++j) {
      p[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * m + i));
    }
    const __m128i t01[2] = {_mm_unpacklo_epi8(p[0], p[1]), _mm_unpackhi_epi8(p[0], p[1])};
    const __m128i t23[2] = {_mm_unpacklo_epi8(p[2], p[3]), _mm_unpackhi_epi8(p[2], p[3])};
    for (int h = 0; h < 2; ++h) {
      __m128i a = _mm_unpacklo_epi16(t01[h], t23[h]);
      __m128i b = _mm_unpackhi_epi16(t01[h], t23[h]);
      a = _mm_or_si128(_mm_srli_epi32(a, 1), _mm_slli_epi32(a, 31));
      b = _mm_or_si128(_mm_srli_epi32(b, 1), _mm_slli_epi32(b, 31));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * i + 32 * h), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * i + 32 * h + 16), b);
    }
  }
  return i;
}
#else
int64_t Group2Sse2(const char*, int64_t, char*) { return 0; }
int64_t Ungroup2Sse2(const char*, int64_t, char*) { return 0; }
int64_t Group4Sse2(const char*, int64_t, char*) { return 0; }
int64_t Ungroup4Sse2(const char*, int64_t, char*) { return 0; }
#endif

// Groups elements [from, m) of the m at `src` into the planes at `dst` (plane j at dst + j * m).
template <typename T>
void GroupTail(const char* src, int64_t from, int64_t m, char* dst) {
  constexpr int kW = sizeof(T);
  for (int64_t i = from; i < m; ++i) {
    T v;
    std::memcpy(&v, src + i * kW, kW);
    v = static_cast<T>((v << 1) | (v >> (8 * kW - 1)));
    for (int j = 0; j < kW; ++j) dst[j * m + i] = static_cast<char>((v >> (8 * j)) & 0xFF);
  }
}

template <typename T>
void UngroupTail(const char* src, int64_t from, int64_t m, char* dst) {
  constexpr int kW = sizeof(T);
  for (int64_t i = from; i < m; ++i) {
    T v = 0;
    for (int j = 0; j < kW; ++j)
      v |= static_cast<T>(static_cast<uint8_t>(src[j * m + i])) << (8 * j);
    v = static_cast<T>((v >> 1) | (v << (8 * kW - 1)));
    std::memcpy(dst + i * kW, &v, kW);
  }
}

void Group(int w, const char* src, int64_t m, char* dst) {
  switch (w) {
    case 2:
      return GroupTail<uint16_t>(src, Group2Sse2(src, m, dst), m, dst);
    case 4:
      return GroupTail<uint32_t>(src, Group4Sse2(src, m, dst), m, dst);
    case 8:
      return GroupPlanes<uint64_t>(src, m, dst);
    default:
      std::memcpy(dst, src, m);
  }
}

void Ungroup(int w, const char* src, int64_t m, char* dst) {
  switch (w) {
    case 2:
      return UngroupTail<uint16_t>(src, Ungroup2Sse2(src, m, dst), m, dst);
    case 4:
      return UngroupTail<uint32_t>(src, Ungroup4Sse2(src, m, dst), m, dst);
    case 8:
      return UngroupPlanes<uint64_t>(src, m, dst);
    default:
      std::memcpy(dst, src, m);
  }
}

absl::Status Corrupt(absl::string_view what, absl::string_view detail) {
  return absl::DataLossError(absl::StrCat("compressed ", what, ": ", detail));
}

// Compresses `n` bytes at `src` onto the end of `out`; false (and `out` unchanged) when zstd
// fails or does not make them smaller.
bool AppendZstd(const char* src, int64_t n, int level, CodecScratch::State& s, std::string* out);

}  // namespace

struct CodecScratch::State {
  ZSTD_CCtx* cctx = nullptr;
  int level = 0;  // the level cctx is set to (0: not yet)
  ZSTD_DCtx* dctx = nullptr;
  std::string planes;
  std::string packed;
};

CodecScratch::CodecScratch() : state_(std::make_unique<State>()) {}
CodecScratch::~CodecScratch() {
  ZSTD_freeCCtx(state_->cctx);
  ZSTD_freeDCtx(state_->dctx);
}

namespace {

// Sets the context's level (Huffman-coded literals at every level: negative levels turn them
// off by default, and a byte plane at a very fast level is then close to its order-0 entropy,
// as ZipNN's Huffman stage is).
void SetLevel(CodecScratch::State& s, int level) {
  if (s.level == level) return;
  ZSTD_CCtx_reset(s.cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(s.cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(s.cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  s.level = level;
}

// Compressed size of `n` bytes at `level` into s.packed (an error counts as no gain).
size_t Compress(const char* src, size_t n, int level, CodecScratch::State& s) {
  SetLevel(s, level);
  const size_t got = ZSTD_compress2(s.cctx, s.packed.data(), s.packed.size(), src, n);
  return ZSTD_isError(got) ? n + 1 : got;
}

bool AppendZstd(const char* src, int64_t n, int level, CodecScratch::State& s, std::string* out) {
  if (n == 0) return false;
  if (s.cctx == nullptr) s.cctx = ZSTD_createCCtx();
  if (s.cctx == nullptr) return false;
  const size_t bound = ZSTD_compressBound(static_cast<size_t>(n));
  if (s.packed.size() < bound) s.packed.resize(bound);
  if (n > 4 * kProbeBytes) {
    // The plane's first kProbeBytes decide: stored raw when they do not shrink (the mantissa
    // planes of trained weights; ZipNN likewise gives up early), and for the automatic level,
    // LZ matching (level 1) only where it beats the entropy stage alone (e.g. the repeated
    // values of optimizer state), as the entropy stage is several times faster.
    const int first = level == 0 ? kPlaneLevel : level;
    const size_t fast = Compress(src, kProbeBytes, first, s);
    if (fast >= static_cast<size_t>(kProbeBytes)) return false;
    if (level == 0) level = Compress(src, kProbeBytes, 1, s) * 100 < fast * 97 ? 1 : kPlaneLevel;
  }
  const size_t got = Compress(src, n, level == 0 ? kPlaneLevel : level, s);
  if (static_cast<int64_t>(got) >= n) return false;
  out->append(s.packed.data(), got);
  return true;
}

}  // namespace

absl::StatusOr<CompressionOptions> ParseCompression(absl::string_view spec) {
  CompressionOptions o;
  const absl::string_view given = spec;
  if (spec.empty() || spec == "none") return o;
  o.enabled = true;
  if (spec == "zstd") return o;  // level 0: each codec's default
  int level = 0;
  if (absl::ConsumePrefix(&spec, "zstd:") && absl::SimpleAtoi(spec, &level) && level >= -1000 &&
      level <= 19 && level != 0) {
    o.level = level;
    return o;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "compression \"", given, "\" is not none, zstd or zstd:<level> (-1000 to 19, not 0)"));
}

std::string CompressionSpec(const CompressionOptions& o) {
  if (!o.enabled) return "none";
  return o.level == 0 ? "zstd" : absl::StrCat("zstd:", o.level);
}

absl::string_view PieceCodecName(PieceCodec codec) {
  switch (codec) {
    case PieceCodec::kNone:
      return "none";
    case PieceCodec::kZstd:
      return "zstd";
    case PieceCodec::kByteGroupZstd:
      return "bytegroup-zstd";
  }
  return "?";
}

absl::StatusOr<PieceCodec> PieceCodecFromInt(int64_t value) {
  if (value < 0 || value > static_cast<int64_t>(PieceCodec::kByteGroupZstd)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown piece codec ", value));
  }
  return static_cast<PieceCodec>(value);
}

int ElementWidthFor(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kC64:
      return 4;
    case DType::kF64:
      return 8;
    default:
      return 1;
  }
}

PieceCodec CodecForDType(DType dtype) {
  return ElementWidthFor(dtype) > 1 ? PieceCodec::kByteGroupZstd : PieceCodec::kZstd;
}

int64_t FrameIndexBytes(int64_t raw_bytes, int64_t chunk_bytes) {
  const int64_t n = raw_bytes == 0 ? 0 : (raw_bytes + chunk_bytes - 1) / chunk_bytes;
  return kFrameHeaderBytes + kFrameIndexEntryBytes * n;
}

int64_t MaxFrameBytes(int64_t raw_bytes, const CodecParams& params) {
  return FrameIndexBytes(raw_bytes, params.chunk_bytes) + raw_bytes;
}

absl::Status ValidateCodecParams(const CodecParams& p) {
  const bool group = p.codec == PieceCodec::kByteGroupZstd;
  if ((p.codec != PieceCodec::kZstd && !group) || !ValidWidth(p.element_width) ||
      (!group && p.element_width != 1) || p.chunk_bytes < 1 ||
      p.chunk_bytes > kMaxCodecChunkBytes || p.level < ZSTD_minCLevel() ||
      p.level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad codec parameters: codec ", PieceCodecName(p.codec), ", element width ",
                     p.element_width, ", chunk ", p.chunk_bytes, " bytes (1 to ",
                     kMaxCodecChunkBytes, "), zstd level ", p.level));
  }
  return absl::OkStatus();
}

EncodedChunk EncodeChunk(const char* raw, int64_t n, const CodecParams& params,
                         CodecScratch& scratch) {
  EncodedChunk out;
  EncodeChunkInto(raw, n, params, scratch, &out);
  return out;
}

void EncodeChunkInto(const char* raw, int64_t n, const CodecParams& params, CodecScratch& scratch,
                     EncodedChunk* out_chunk) {
  CodecScratch::State& s = scratch.state();
  EncodedChunk& out = *out_chunk;
  out.bytes.clear();
  out.flags = 0;
  out.raw_bytes = n;
  out.raw_xxh3 = Xxh3(raw, n);
  bool packed = false;
  if (params.codec == PieceCodec::kZstd) {
    packed = AppendZstd(raw, n, params.level == 0 ? 1 : params.level, s, &out.bytes);
  } else {
    const int w = params.element_width;
    const int64_t m = n / w;
    if (static_cast<int64_t>(s.planes.size()) < m * w) s.planes.resize(m * w);
    Group(w, raw, m, s.planes.data());
    out.bytes.assign(4 * w, '\0');
    for (int j = 0; j < w; ++j) {
      const char* plane = s.planes.data() + j * m;
      const size_t before = out.bytes.size();
      uint32_t size = 0;
      if (AppendZstd(plane, m, params.level, s, &out.bytes)) {
        size = static_cast<uint32_t>(out.bytes.size() - before);
      } else {
        out.bytes.append(plane, m);
        size = static_cast<uint32_t>(m) | kPlaneRaw;
      }
      PutU32(out.bytes.data() + 4 * j, size);
    }
    out.bytes.append(raw + m * w, n - m * w);
    packed = static_cast<int64_t>(out.bytes.size()) < n;
  }
  if (!packed) {
    out.bytes.assign(raw, n);
    out.flags = kChunkRaw;
  }
}

std::string EncodeFrameHead(const CodecParams& params, int64_t raw_bytes,
                            const std::vector<FrameEntry>& entries) {
  std::string frame(kFrameHeaderBytes + kFrameIndexEntryBytes * entries.size(), '\0');
  char* h = frame.data();
  std::memcpy(h, kMagic, 4);
  h[4] = static_cast<char>(kVersion);
  h[5] = static_cast<char>(params.codec);
  h[6] = static_cast<char>(params.element_width);
  h[7] = 0;
  PutU32(h + 8, static_cast<uint32_t>(params.chunk_bytes));
  PutU32(h + 12, static_cast<uint32_t>(entries.size()));
  PutU64(h + 16, static_cast<uint64_t>(raw_bytes));
  for (size_t i = 0; i < entries.size(); ++i) {
    char* e = h + kFrameHeaderBytes + kFrameIndexEntryBytes * i;
    PutU32(e, entries[i].stored_bytes);
    PutU32(e + 4, entries[i].flags);
    PutU64(e + 8, entries[i].raw_xxh3);
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, h, 24);
  XXH3_64bits_update(st, h + kFrameHeaderBytes, kFrameIndexEntryBytes * entries.size());
  PutU64(h + 24, XXH3_64bits_digest(st));
  XXH3_freeState(st);
  return frame;
}

std::string AssembleFrame(const CodecParams& params, int64_t raw_bytes,
                          const std::vector<EncodedChunk>& chunks) {
  std::vector<FrameEntry> entries(chunks.size());
  int64_t total = kFrameHeaderBytes + kFrameIndexEntryBytes * static_cast<int64_t>(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    entries[i] = {static_cast<uint32_t>(chunks[i].bytes.size()), chunks[i].flags,
                  chunks[i].raw_xxh3};
    total += static_cast<int64_t>(chunks[i].bytes.size());
  }
  std::string frame = EncodeFrameHead(params, raw_bytes, entries);
  frame.reserve(total);
  for (const EncodedChunk& c : chunks) frame.append(c.bytes);
  return frame;
}

absl::StatusOr<EncodedPiece> EncodePiece(const void* raw, int64_t n, const CodecParams& params) {
  CKPT_RETURN_IF_ERROR(ValidateCodecParams(params));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative piece size ", n));
  CodecScratch scratch;
  std::vector<EncodedChunk> chunks;
  const char* p = static_cast<const char*>(raw);
  for (int64_t off = 0; off < n; off += params.chunk_bytes) {
    chunks.push_back(EncodeChunk(p + off, std::min(params.chunk_bytes, n - off), params, scratch));
  }
  EncodedPiece out;
  out.frame = AssembleFrame(params, n, chunks);
  std::vector<uint64_t> hashes;
  hashes.reserve(chunks.size());
  for (const EncodedChunk& c : chunks) hashes.push_back(c.raw_xxh3);
  out.raw_xxh3 = RangeChecksum(hashes);
  return out;
}

uint64_t FrameIndex::RawChecksum() const {
  std::vector<uint64_t> hashes;
  hashes.reserve(chunks.size());
  for (const FrameChunk& c : chunks) hashes.push_back(c.raw_xxh3);
  return RangeChecksum(hashes);
}

namespace {

absl::Status CheckExpect(const FrameExpect& e, absl::string_view what) {
  if ((e.codec != PieceCodec::kZstd && e.codec != PieceCodec::kByteGroupZstd) || e.raw_bytes < 0 ||
      e.chunk_bytes < 1 || e.chunk_bytes > kMaxCodecChunkBytes || e.stored_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed ", what, ": the manifest's codec ", static_cast<int>(e.codec),
                     ", raw size ", e.raw_bytes, ", stored size ", e.stored_bytes,
                     " or chunk size ", e.chunk_bytes, " is not valid"));
  }
  return absl::OkStatus();
}

// Checks the 32-byte header at `h` against `e`.
absl::Status CheckHeader(const char* h, const FrameExpect& e, int64_t num_chunks,
                         absl::string_view what) {
  if (std::memcmp(h, kMagic, 4) != 0) return Corrupt(what, "no frame magic");
  if (static_cast<uint8_t>(h[4]) != kVersion) {
    return Corrupt(what, absl::StrCat("frame version ", static_cast<int>(h[4]), " is not 1"));
  }
  const int codec = static_cast<uint8_t>(h[5]);
  const int width = static_cast<uint8_t>(h[6]);
  if (codec != static_cast<int>(e.codec) || !ValidWidth(width) ||
      (e.codec == PieceCodec::kZstd && width != 1) || h[7] != 0) {
    return Corrupt(what,
                   absl::StrCat("frame codec ", codec, " width ", width,
                                " does not match the manifest's codec ", PieceCodecName(e.codec)));
  }
  if (GetU32(h + 8) != static_cast<uint64_t>(e.chunk_bytes) ||
      GetU32(h + 12) != static_cast<uint64_t>(num_chunks) ||
      GetU64(h + 16) != static_cast<uint64_t>(e.raw_bytes)) {
    return Corrupt(what,
                   absl::StrCat("frame says ", GetU64(h + 16), " raw bytes in ", GetU32(h + 12),
                                " chunks of ", GetU32(h + 8), "; the manifest says ", e.raw_bytes,
                                " in ", num_chunks, " of ", e.chunk_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FrameIndex> ParseFrameIndex(absl::string_view prefix, const FrameExpect& e,
                                           absl::string_view what) {
  CKPT_RETURN_IF_ERROR(CheckExpect(e, what));
  const int64_t n = e.raw_bytes == 0 ? 0 : (e.raw_bytes - 1) / e.chunk_bytes + 1;
  if (e.stored_bytes < kFrameHeaderBytes ||
      n > (e.stored_bytes - kFrameHeaderBytes) / kFrameIndexEntryBytes ||
      n > std::numeric_limits<uint32_t>::max()) {
    return Corrupt(what, absl::StrCat("the manifest's stored size ", e.stored_bytes,
                                      " cannot hold the index of ", n, " chunks"));
  }
  const int64_t index_bytes = kFrameHeaderBytes + kFrameIndexEntryBytes * n;
  if (static_cast<int64_t>(prefix.size()) < index_bytes) {
    return Corrupt(
        what, absl::StrCat("truncated: ", prefix.size(), " bytes, the index needs ", index_bytes));
  }
  const char* h = prefix.data();
  CKPT_RETURN_IF_ERROR(CheckHeader(h, e, n, what));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, h, 24);
  XXH3_64bits_update(st, h + kFrameHeaderBytes, index_bytes - kFrameHeaderBytes);
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (sum != GetU64(h + 24)) return Corrupt(what, "frame index checksum mismatch");
  FrameIndex index;
  index.codec = e.codec;
  index.element_width = static_cast<uint8_t>(h[6]);
  index.chunk_bytes = e.chunk_bytes;
  index.raw_bytes = e.raw_bytes;
  index.chunks.resize(n);
  int64_t stored = index_bytes;
  for (int64_t i = 0; i < n; ++i) {
    const char* p = h + kFrameHeaderBytes + kFrameIndexEntryBytes * i;
    FrameChunk& c = index.chunks[i];
    c.stored_offset = stored;
    c.stored_bytes = GetU32(p);
    c.flags = GetU32(p + 4);
    c.raw_xxh3 = GetU64(p + 8);
    c.raw_offset = i * e.chunk_bytes;
    c.raw_bytes = std::min(e.chunk_bytes, e.raw_bytes - c.raw_offset);
    if ((c.flags & ~kChunkRaw) != 0) {
      return Corrupt(what, absl::StrCat("chunk ", i, " has unknown flags ", c.flags));
    }
    stored += c.stored_bytes;
    if (stored > e.stored_bytes) break;
  }
  if (stored != e.stored_bytes) {
    return Corrupt(what, absl::StrCat("the frame's chunks take ", stored,
                                      " bytes or more; the manifest says ", e.stored_bytes));
  }
  return index;
}

namespace {

// Decodes a byte-grouped chunk of `raw` bytes from `in` into `dest`.
absl::Status DecodeGrouped(int w, absl::string_view in, int64_t raw, char* dest,
                           CodecScratch::State& s, const std::string& where) {
  const int64_t m = raw / w;
  const int64_t tail = raw - m * w;
  if (static_cast<int64_t>(in.size()) < 4 * w + tail) return Corrupt(where, "chunk too short");
  int64_t pos = 4 * w;
  if (static_cast<int64_t>(s.planes.size()) < m * w) s.planes.resize(m * w);
  for (int j = 0; j < w; ++j) {
    const uint32_t word = GetU32(in.data() + 4 * j);
    const int64_t size = word & ~kPlaneRaw;
    if (size > static_cast<int64_t>(in.size()) - tail - pos) {
      return Corrupt(where, absl::StrCat("plane ", j, " of ", size, " bytes overruns the chunk"));
    }
    char* plane = s.planes.data() + j * m;
    if ((word & kPlaneRaw) != 0) {
      if (size != m) return Corrupt(where, absl::StrCat("raw plane ", j, " is not ", m, " bytes"));
      std::memcpy(plane, in.data() + pos, m);
    } else {
      const size_t got = ZSTD_decompressDCtx(s.dctx, plane, m, in.data() + pos, size);
      if (ZSTD_isError(got) || static_cast<int64_t>(got) != m) {
        return Corrupt(where, absl::StrCat("plane ", j, ": ",
                                           ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short",
                                           " (want ", m, " bytes)"));
      }
    }
    pos += size;
  }
  if (pos + tail != static_cast<int64_t>(in.size())) {
    return Corrupt(where, "chunk size does not match its planes");
  }
  Ungroup(w, s.planes.data(), m, dest);
  std::memcpy(dest + m * w, in.data() + pos, tail);
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeChunk(const FrameIndex& index, int c, absl::string_view stored, char* dest,
                         bool verify, CodecScratch& scratch, absl::string_view what) {
  if (c < 0 || c >= static_cast<int>(index.chunks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("compressed ", what, ": no chunk ", c));
  }
  const FrameChunk& fc = index.chunks[c];
  const std::string where = absl::StrCat(what, " chunk ", c);
  if (static_cast<int64_t>(stored.size()) != fc.stored_bytes) {
    return Corrupt(where, absl::StrCat(stored.size(), " bytes; the index says ", fc.stored_bytes));
  }
  CodecScratch::State& s = scratch.state();
  if (s.dctx == nullptr) s.dctx = ZSTD_createDCtx();
  if (s.dctx == nullptr) return absl::ResourceExhaustedError("cannot create a zstd context");
  if ((fc.flags & kChunkRaw) != 0) {
    if (fc.stored_bytes != fc.raw_bytes) return Corrupt(where, "raw chunk of the wrong size");
    std::memcpy(dest, stored.data(), fc.raw_bytes);
  } else if (index.codec == PieceCodec::kZstd) {
    const size_t got =
        ZSTD_decompressDCtx(s.dctx, dest, fc.raw_bytes, stored.data(), stored.size());
    if (ZSTD_isError(got) || static_cast<int64_t>(got) != fc.raw_bytes) {
      return Corrupt(where, absl::StrCat(ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short",
                                         " (want ", fc.raw_bytes, " bytes)"));
    }
  } else {
    CKPT_RETURN_IF_ERROR(DecodeGrouped(index.element_width, stored, fc.raw_bytes, dest, s, where));
  }
  if (verify && Xxh3(dest, fc.raw_bytes) != fc.raw_xxh3) {
    return Corrupt(where, "raw checksum mismatch after decoding");
  }
  return absl::OkStatus();
}

absl::Status DecodePiece(absl::string_view frame, const FrameExpect& expect, void* dest,
                         bool verify, absl::string_view what) {
  if (static_cast<int64_t>(frame.size()) != expect.stored_bytes) {
    return Corrupt(what, absl::StrCat("frame of ", frame.size(), " bytes; the manifest says ",
                                      expect.stored_bytes));
  }
  CKPT_ASSIGN_OR_RETURN(FrameIndex index, ParseFrameIndex(frame, expect, what));
  CodecScratch scratch;
  char* out = static_cast<char*>(dest);
  for (size_t c = 0; c < index.chunks.size(); ++c) {
    const FrameChunk& fc = index.chunks[c];
    CKPT_RETURN_IF_ERROR(DecodeChunk(index, static_cast<int>(c),
                                     frame.substr(fc.stored_offset, fc.stored_bytes),
                                     out + fc.raw_offset, verify, scratch, what));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
