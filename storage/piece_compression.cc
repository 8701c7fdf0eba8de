#include "storage/piece_compression.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checksum.h"

namespace ckpt {
namespace {

int Threads(int requested, size_t tasks) {
  const int n = requested > 0 ? requested
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(n, tasks)));
}

// Runs task(i) for i in [0, n) on `threads` threads, each with its own scratch; stops at the
// first error, which it returns.
absl::Status ForEachChunk(size_t n, int threads,
                          const std::function<absl::Status(size_t, CodecScratch&)>& task) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    CodecScratch scratch;
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      absl::Status s = task(i, scratch);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < Threads(threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return first;
}

}  // namespace

absl::StatusOr<PackedPiece> EncodePieceParallel(const void* raw, int64_t n, DType dtype,
                                                const CompressionOptions& options) {
  CodecParams params;
  params.codec = CodecForDType(dtype);
  params.element_width = params.codec == PieceCodec::kByteGroupZstd ? ElementWidthFor(dtype) : 1;
  params.chunk_bytes = options.chunk_bytes;
  params.level = options.level;
  CKPT_RETURN_IF_ERROR(ValidateCodecParams(params));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative piece size ", n));
  const size_t count = n == 0 ? 0 : static_cast<size_t>((n - 1) / params.chunk_bytes + 1);
  std::vector<EncodedChunk> chunks(count);
  const char* p = static_cast<const char*>(raw);
  CKPT_RETURN_IF_ERROR(ForEachChunk(count, options.threads, [&](size_t i, CodecScratch& s) {
    const int64_t off = static_cast<int64_t>(i) * params.chunk_bytes;
    chunks[i] = EncodeChunk(p + off, std::min(params.chunk_bytes, n - off), params, s);
    return absl::OkStatus();
  }));
  PackedPiece out;
  out.codec = params.codec;
  out.chunk_bytes = params.chunk_bytes;
  out.frame = AssembleFrame(params, n, chunks);
  std::vector<uint64_t> hashes;
  hashes.reserve(count);
  for (const EncodedChunk& c : chunks) hashes.push_back(c.raw_xxh3);
  out.raw_xxh3 = RangeChecksum(hashes);
  return out;
}

absl::Status DecodePieceParallel(absl::string_view frame, const FrameExpect& expect, void* dest,
                                 bool verify, int threads, absl::string_view what) {
  if (static_cast<int64_t>(frame.size()) != expect.stored_bytes) {
    return absl::DataLossError(absl::StrCat("compressed ", what, ": frame of ", frame.size(),
                                            " bytes; the manifest says ", expect.stored_bytes));
  }
  CKPT_ASSIGN_OR_RETURN(FrameIndex index, ParseFrameIndex(frame, expect, what));
  char* out = static_cast<char*>(dest);
  return ForEachChunk(index.chunks.size(), threads, [&](size_t c, CodecScratch& s) {
    const FrameChunk& fc = index.chunks[c];
    return DecodeChunk(index, static_cast<int>(c), frame.substr(fc.stored_offset, fc.stored_bytes),
                       out + fc.raw_offset, verify, s, what);
  });
}

void SetPackedFields(const PackedPiece& packed, pb::StoredPiece* piece) {
  piece->set_codec(static_cast<uint32_t>(packed.codec));
  piece->set_stored_length(static_cast<int64_t>(packed.frame.size()));
  piece->set_raw_xxh3_64(packed.raw_xxh3);
  piece->set_codec_chunk_bytes(packed.chunk_bytes);
}

absl::StatusOr<std::vector<PackedPieces>> CompressPieces(const std::vector<TensorMeta>& tensors,
                                                         const std::vector<DataFilePlan>& files,
                                                         const CompressionOptions& options) {
  std::map<absl::string_view, DType> dtypes;
  for (const TensorMeta& t : tensors) dtypes.emplace(t.key, t.dtype);
  std::vector<PackedPieces> out(files.size());
  for (size_t f = 0; f < files.size(); ++f) {
    out[f].resize(files[f].pieces.size());
    for (size_t i = 0; i < files[f].pieces.size(); ++i) {
      const PieceData& p = files[f].pieces[i];
      if (p.size_bytes <= 0 || p.data == nullptr) continue;  // WriteDataFiles judges these
      auto t = dtypes.find(p.key);
      if (t == dtypes.end()) {
        return absl::InvalidArgumentError(absl::StrCat("piece of unknown tensor \"", p.key,
                                                       "\" (rank ", files[f].writer_rank, ")"));
      }
      CKPT_ASSIGN_OR_RETURN(out[f][i],
                            EncodePieceParallel(p.data, p.size_bytes, t->second, options));
    }
  }
  return out;
}

}  // namespace ckpt
