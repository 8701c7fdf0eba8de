// Many-entries benchmark: safetensors files of N tiny tensors (at most a million a file) through
// every step that walks its entries, each timed on its own (a tool, never a test): header parse,
// import, manifest validation, reader open, verify and export. Each should grow as N log N at
// worst.
//
//   bazel build -c opt //tools/bench:many_entries_benchmark
//   bazel-out/k8-opt/bin/tools/bench/many_entries_benchmark --entries=1000000 --dir=/tmp/ckpt_many
// --manifest_piece_file_bytes=B writes the manifest in piece files of B bytes (format 2);
// --keep leaves the checkpoint (<dir>/ckpt) for `ckptctl inspect|verify` under /usr/bin/time.
// --rows_per_tensor=R writes, instead of importing, a checkpoint shaped like a large job's:
// tensors of R rows stored one row per piece (N pieces), 4096 pieces a data file.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/interop.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/safetensors.h"
#include "storage/verify.h"

namespace ckpt {
namespace {

struct Config {
  std::string dir = "/tmp/ckpt_many";
  int64_t entries = 100000;
  bool export_too = true;
  int64_t manifest_piece_file_bytes = 0;  // 0: one manifest file when it fits
  bool keep = false;
  int64_t rows_per_tensor = 0;  // >0: a sharded checkpoint written directly, not an import
};

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "many_entries_benchmark: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

// CPU seconds (user + system, all threads) of this process so far.
double CpuSeconds() {
  struct rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Wall and CPU seconds of f(): on a shared machine the CPU time is the steadier figure.
struct Timing {
  double wall = 0, cpu = 0;
};

Timing Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = CpuSeconds();
  f();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          CpuSeconds() - c0};
}

// Most entries in one source file (its header stays under the parser's 100 MB limit).
constexpr int64_t kMaxEntriesPerFile = 1000000;

// "<dir>/src/model-<i>.safetensors", together `n` F32 tensors of shape [2] named like a model's
// parameters, at most kMaxEntriesPerFile a file; returns the first file (its header is the one
// timed) and the source directory.
std::pair<std::string, std::string> WriteSource(const std::string& dir, int64_t n) {
  const std::string src = JoinPath(dir, "src");
  Die(MakeDir(src), "mkdir src");
  std::string first;
  for (int64_t begin = 0, part = 0; begin < n; begin += kMaxEntriesPerFile, ++part) {
    const int64_t count = std::min(kMaxEntriesPerFile, n - begin);
    std::vector<SafetensorsEntry> entries;
    entries.reserve(count);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = begin + j;
      entries.push_back({absl::StrCat("model.layers.", i / 16, ".param_", i % 16, ".weight"),
                         DType::kF32,
                         {2},
                         j * 8,
                         j * 8 + 8});
    }
    absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
    Die(header.status(), "encode header");
    std::string file = *std::move(header);
    file.append(static_cast<size_t>(count * 8), '\x01');
    const std::string path = JoinPath(src, absl::StrFormat("model-%05d.safetensors", part));
    Die(WriteFileDurably(path, file), "write source");
    if (first.empty()) first = path;
  }
  return {first, src};
}

// Pieces of a sharded checkpoint in one data file (one writer rank's file).
constexpr int64_t kPiecesPerDataFile = 4096;

// A checkpoint like a large job's: about `n` pieces, F32 tensors of `rows` x 2 each stored one
// row per piece, kPiecesPerDataFile pieces a data file; written directly (no source file).
void WriteSharded(const std::string& ckpt, int64_t n, int64_t rows, const WriteOptions& wo) {
  static const float kRow[2] = {1.0f, 2.0f};
  CheckpointContents c;
  const int64_t tensors = std::max<int64_t>(1, n / rows);
  c.files.resize(
      static_cast<size_t>((tensors * rows + kPiecesPerDataFile - 1) / kPiecesPerDataFile));
  for (size_t f = 0; f < c.files.size(); ++f) c.files[f].writer_rank = static_cast<int>(f);
  int64_t piece = 0;
  for (int64_t t = 0; t < tensors; ++t) {
    c.tensors.push_back({absl::StrCat("model.layers.", t, ".weight"), DType::kF32, {rows, 2}});
    for (int64_t r = 0; r < rows; ++r, ++piece) {
      c.files[piece / kPiecesPerDataFile].pieces.push_back(
          {c.tensors.back().key, Region{{r, 0}, {1, 2}, std::nullopt}, kRow, 8});
    }
  }
  Die(WriteCheckpoint(ckpt, c, wo).status(), "write checkpoint");
}

void Row(const char* step, Timing t, const std::string& note = "") {
  std::printf("%-28s %8.3f s wall %8.3f s cpu  %s\n", step, t.wall, t.cpu, note.c_str());
  std::fflush(stdout);
}

// The steps that read checkpoint `ckpt` back, each timed; then removes c.dir unless c.keep.
void ReadBack(const Config& c, const std::string& ckpt) {
  int64_t manifest_bytes = 0;
  const absl::StatusOr<std::vector<std::string>> names = ListDir(ckpt);
  Die(names.status(), "list");
  for (const std::string& name : *names) {
    if (name != "data") manifest_bytes += FileSize(JoinPath(ckpt, name)).value_or(0);
  }
  Row("stream manifest", Seconds([&] {
        Die(StreamManifestFile(ckpt, [](int64_t, pb::StoredPiece&) { return absl::OkStatus(); })
                .status(),
            "stream");
      }),
      "StreamManifestFile, pieces dropped");
  pb::Manifest manifest;
  Row("read + parse + validate manifest", Seconds([&] {
        auto m = ReadManifestFile(ckpt);
        Die(m.status(), "manifest");
        manifest = *std::move(m);
      }),
      absl::StrCat(manifest_bytes, " manifest bytes"));
  Row("validate manifest", Seconds([&] { Die(ValidateManifest(manifest), "validate"); }));
  Row("reader open", Seconds([&] { Die(CheckpointReader::Open(ckpt).status(), "open"); }));
  Row("verify", Seconds([&] {
        auto report = VerifyCheckpoint(ckpt, IoOptions{});
        Die(report.status(), "verify");
        if (!report->problems.empty()) {
          Die(absl::DataLossError(report->problems.front()), "verify");
        }
      }));
  if (c.export_too) {
    Row("export", Seconds([&] {
          Die(ExportCheckpoint(ckpt, JoinPath(c.dir, "out.safetensors"), ExportOptions{}).status(),
              "export");
        }));
  }
  if (!c.keep) (void)RemoveTree(c.dir);
}

void Run(const Config& c) {
  (void)RemoveTree(c.dir);
  Die(MakeDir(c.dir), "mkdir");
  std::printf("%lld entries in %s\n", static_cast<long long>(c.entries), c.dir.c_str());
  const std::string ckpt = JoinPath(c.dir, "ckpt");
  WriteOptions wo;
  if (c.manifest_piece_file_bytes > 0) {
    wo.manifest_files.max_single_file_bytes = c.manifest_piece_file_bytes;
    wo.manifest_files.piece_file_bytes = c.manifest_piece_file_bytes;
  }
  if (c.rows_per_tensor > 0) {
    Row("write sharded checkpoint",
        Seconds([&] { WriteSharded(ckpt, c.entries, c.rows_per_tensor, wo); }));
    ReadBack(c, ckpt);
    return;
  }
  std::string first, source;
  Row("write source files",
      Seconds([&] { std::tie(first, source) = WriteSource(c.dir, c.entries); }));
  const std::string bytes = *ReadWholeFile(first, int64_t{1} << 40);
  uint64_t header_len = *ParseSafetensorsPrefix(bytes.substr(0, 8), bytes.size(), first);
  const std::string json = bytes.substr(8, header_len);
  Row("parse header", Seconds([&] {
        Die(ParseSafetensorsHeader(json, static_cast<int64_t>(bytes.size()), first).status(),
            "parse");
      }),
      absl::StrCat(json.size(), " header bytes (the first file's)"));
  Row("import", Seconds([&] { Die(ImportSafetensors(source, ckpt, wo).status(), "import"); }));
  (void)RemoveTree(source);
  ReadBack(c, ckpt);
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  ckpt::Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq),
                      value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (name == "--dir") {
      c.dir = value;
    } else if (name == "--entries" && absl::SimpleAtoi(value, &c.entries) && c.entries > 0) {
    } else if (name == "--no_export") {
      c.export_too = false;
    } else if (name == "--keep") {
      c.keep = true;
    } else if (name == "--rows_per_tensor" && absl::SimpleAtoi(value, &c.rows_per_tensor) &&
               c.rows_per_tensor > 0) {
    } else if (name == "--manifest_piece_file_bytes" &&
               absl::SimpleAtoi(value, &c.manifest_piece_file_bytes) &&
               c.manifest_piece_file_bytes > 0) {
    } else {
      std::fprintf(stderr,
                   "usage: many_entries_benchmark [--entries=N] [--dir=D] [--no_export] [--keep]\n"
                   "    [--manifest_piece_file_bytes=B] [--rows_per_tensor=R]\n");
      return 2;
    }
  }
  ckpt::Run(c);
  return 0;
}
