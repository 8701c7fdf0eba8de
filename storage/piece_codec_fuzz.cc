// Fuzz target: a piece codec frame through the decoder. The input's first 8 bytes say what the
// manifest claims (raw size, chunk size, codec); the rest is the stored frame. Anything may be
// refused; a refusal must be DataLoss or InvalidArgument with a message, and a frame that
// decodes with verification must have produced exactly the bytes its index's checksums name.
// Any violation aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "storage/checksum.h"
#include "storage/piece_codec.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "piece_codec_fuzz: %s\n", what);
  std::abort();
}

uint32_t U32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  ckpt::FrameExpect e;
  e.raw_bytes = U32(data) % (1 << 20);  // the manifest's raw size (bounded: the output buffer)
  e.chunk_bytes = static_cast<int64_t>(data[4] | data[5] << 8 | (data[6] & 0x0F) << 16);
  e.codec = static_cast<ckpt::PieceCodec>(data[7] % 4);
  const absl::string_view frame(reinterpret_cast<const char*>(data) + 8, size - 8);
  e.stored_bytes = static_cast<int64_t>(frame.size());
  std::string out(e.raw_bytes, '\0');
  const absl::Status s = ckpt::DecodePiece(frame, e, out.data(), /*verify=*/true, "fuzz piece");
  if (!s.ok()) {
    Check(s.code() == absl::StatusCode::kDataLoss || s.code() == absl::StatusCode::kInvalidArgument,
          "an error other than DataLoss or InvalidArgument");
    Check(!s.message().empty(), "an error without a message");
    (void)ckpt::DecodePiece(frame, e, out.data(), /*verify=*/false, "fuzz piece");
    return 0;
  }
  auto index = ckpt::ParseFrameIndex(frame, e, "fuzz piece");
  Check(index.ok(), "a decoded frame whose index does not parse");
  ckpt::StreamingChecksum sum(e.chunk_bytes);
  sum.Update(out.data(), out.size());
  Check(sum.Whole() == index->RawChecksum(), "decoded bytes do not match the index checksums");
  return 0;
}
