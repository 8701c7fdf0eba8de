// Many-entries benchmark: a safetensors file of N tiny tensors through every step that walks
// its entries, each timed on its own (a tool, never a test): header parse, import, manifest
// validation, reader open, verify and export. Each should grow as N log N at worst.
//
//   bazel build -c opt //storage:many_entries_benchmark
//   bazel-out/k8-opt/bin/storage/many_entries_benchmark --entries=1000000 --dir=/tmp/ckpt_many
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

// "model.safetensors" with `n` F32 tensors of shape [2] named like a model's parameters.
std::string WriteSource(const std::string& dir, int64_t n) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    entries.push_back({absl::StrCat("model.layers.", i / 16, ".param_", i % 16, ".weight"),
                       DType::kF32,
                       {2},
                       i * 8,
                       i * 8 + 8});
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  Die(header.status(), "encode header");
  std::string file = *std::move(header);
  file.append(static_cast<size_t>(n * 8), '\x01');
  const std::string path = JoinPath(dir, "model.safetensors");
  Die(WriteFileDurably(path, file), "write source");
  return path;
}

void Row(const char* step, Timing t, const std::string& note = "") {
  std::printf("%-28s %8.3f s wall %8.3f s cpu  %s\n", step, t.wall, t.cpu, note.c_str());
  std::fflush(stdout);
}

void Run(const Config& c) {
  (void)RemoveTree(c.dir);
  Die(MakeDir(c.dir), "mkdir");
  std::printf("%lld entries in %s\n", static_cast<long long>(c.entries), c.dir.c_str());
  std::string source;
  Row("write source file", Seconds([&] { source = WriteSource(c.dir, c.entries); }));
  const std::string bytes = *ReadWholeFile(source, int64_t{1} << 40);
  uint64_t header_len = *ParseSafetensorsPrefix(bytes.substr(0, 8), bytes.size(), source);
  const std::string json = bytes.substr(8, header_len);
  Row("parse header", Seconds([&] {
        Die(ParseSafetensorsHeader(json, static_cast<int64_t>(bytes.size()), source).status(),
            "parse");
      }),
      absl::StrCat(json.size(), " header bytes"));

  const std::string ckpt = JoinPath(c.dir, "ckpt");
  Row("import",
      Seconds([&] { Die(ImportSafetensors(source, ckpt, WriteOptions{}).status(), "import"); }));
  const int64_t manifest_bytes = *FileSize(JoinPath(ckpt, kManifestFileName));
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
  (void)RemoveTree(c.dir);
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
    } else {
      std::fprintf(stderr, "usage: many_entries_benchmark [--entries=N] [--dir=D] [--no_export]\n");
      return 2;
    }
  }
  ckpt::Run(c);
  return 0;
}
