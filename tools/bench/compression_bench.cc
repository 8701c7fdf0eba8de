// The piece codec (storage/piece_codec.h) on the tensors of one safetensors file, driven by
// tools/bench/compression_bench.py, which runs the ZipNN peer on the same bytes:
//
//   compression_bench codec <file.safetensors> <threads> <level> <chunk_bytes> <repeats>
//     encodes every tensor (EncodePieceParallel, `threads` threads over chunks), decodes it back
//     (DecodePieceParallel) and checks the bytes are identical; prints one JSON line: raw and
//     stored bytes, best-of-`repeats` compress and decode seconds.
//   compression_bench save <file.safetensors> <dir> <threads> <compression>
//     writes the file's tensors as a checkpoint in <dir>/ckpt with WriteCheckpoint (fsynced and
//     committed: durable) and prints one JSON line with the seconds it took.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/piece_compression.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

struct File {
  std::string bytes;
  SafetensorsHeader header;
};

absl::StatusOr<File> Load(const std::string& path) {
  File f;
  CKPT_ASSIGN_OR_RETURN(f.bytes, ReadWholeFile(path, int64_t{8} << 30));
  const int64_t size = static_cast<int64_t>(f.bytes.size());
  CKPT_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(f.bytes.substr(0, 8), size, path));
  CKPT_ASSIGN_OR_RETURN(f.header, ParseSafetensorsHeader(f.bytes.substr(8, n), size, path));
  return f;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status Codec(const File& f, int threads, int level, int64_t chunk, int repeats) {
  CompressionOptions o;
  o.enabled = true;
  o.threads = threads;
  o.level = level;
  o.chunk_bytes = chunk;
  int64_t raw = 0, stored = 0;
  double best_c = 1e30, best_d = 1e30;
  std::string out;
  for (int r = 0; r < repeats; ++r) {
    std::vector<PackedPiece> packed;
    raw = stored = 0;
    const double t0 = Now();
    for (const SafetensorsEntry& e : f.header.entries) {
      const char* data = f.bytes.data() + f.header.data_start + e.begin;
      CKPT_ASSIGN_OR_RETURN(PackedPiece p, EncodePieceParallel(data, e.end - e.begin, e.dtype, o));
      raw += e.end - e.begin;
      stored += static_cast<int64_t>(p.frame.size());
      packed.push_back(std::move(p));
    }
    const double t1 = Now();
    for (size_t i = 0; i < packed.size(); ++i) {
      const SafetensorsEntry& e = f.header.entries[i];
      out.resize(e.end - e.begin);
      const FrameExpect x{packed[i].codec, e.end - e.begin,
                          static_cast<int64_t>(packed[i].frame.size()), chunk};
      CKPT_RETURN_IF_ERROR(
          DecodePieceParallel(packed[i].frame, x, out.data(), /*verify=*/true, threads, e.name));
    }
    const double t2 = Now();
    for (size_t i = 0; i < packed.size(); ++i) {  // bit-exact, outside the timing
      const SafetensorsEntry& e = f.header.entries[i];
      out.resize(e.end - e.begin);
      const FrameExpect x{packed[i].codec, e.end - e.begin,
                          static_cast<int64_t>(packed[i].frame.size()), chunk};
      CKPT_RETURN_IF_ERROR(DecodePieceParallel(packed[i].frame, x, out.data(), false, 1, e.name));
      if (out.compare(0, out.size(), f.bytes, f.header.data_start + e.begin, out.size()) != 0) {
        return absl::DataLossError(absl::StrCat("round trip of ", e.name, " is not bit-exact"));
      }
    }
    best_c = std::min(best_c, t1 - t0);
    best_d = std::min(best_d, t2 - t1);
  }
  std::printf(
      "{\"raw_bytes\": %lld, \"stored_bytes\": %lld, \"compress_s\": %.6f, \"decode_s\": %.6f, "
      "\"bit_exact\": true}\n",
      static_cast<long long>(raw), static_cast<long long>(stored), best_c, best_d);
  return absl::OkStatus();
}

absl::Status Save(const File& f, const std::string& dir, int threads, const std::string& spec) {
  CheckpointContents c;
  DataFilePlan plan;
  for (const SafetensorsEntry& e : f.header.entries) {
    c.tensors.push_back({e.name, e.dtype, e.shape});
    Region whole{std::vector<int64_t>(e.shape.size(), 0), e.shape, std::nullopt};
    plan.pieces.push_back(
        {e.name, whole, f.bytes.data() + f.header.data_start + e.begin, e.end - e.begin});
  }
  c.files = BalanceIntoFiles(plan.pieces, threads, 0);
  WriteOptions o;
  o.io.num_threads = threads;
  CKPT_ASSIGN_OR_RETURN(o.compression, ParseCompression(spec));
  o.compression.threads = threads;
  const double t0 = Now();
  CKPT_ASSIGN_OR_RETURN(pb::Manifest m, WriteCheckpoint(JoinPath(dir, "ckpt"), c, o));
  const double t1 = Now();
  int64_t file_bytes = 0;
  for (const pb::DataFile& df : m.files()) file_bytes += df.size_bytes();
  std::printf("{\"seconds\": %.6f, \"file_bytes\": %lld}\n", t1 - t0,
              static_cast<long long>(file_bytes));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int a = 0, b = 0, d = 0;
  int64_t chunk = 0;
  absl::Status s;
  if (mode == "codec" && argc == 7 && absl::SimpleAtoi(argv[3], &a) &&
      absl::SimpleAtoi(argv[4], &b) && absl::SimpleAtoi(argv[5], &chunk) &&
      absl::SimpleAtoi(argv[6], &d)) {
    absl::StatusOr<File> f = Load(argv[2]);
    s = f.ok() ? Codec(*f, a, b, chunk, d) : f.status();
  } else if (mode == "save" && argc == 6 && absl::SimpleAtoi(argv[4], &a)) {
    absl::StatusOr<File> f = Load(argv[2]);
    s = f.ok() ? Save(*f, argv[3], a, argv[5]) : f.status();
  } else {
    std::fprintf(stderr,
                 "usage: compression_bench codec <file> <threads> <level> <chunk> <repeats>\n"
                 "       compression_bench save <file> <dir> <threads> <compression>\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "compression_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
