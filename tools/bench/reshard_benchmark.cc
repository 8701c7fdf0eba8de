// Offline reshard throughput next to the disk's own sequential bandwidth, measured in the same
// run. Writes a GPT-style training state (examples/gpt_state.h) saved TP=2 x DP=2 with ZeRO-1
// flat optimizer shards, then reshards it (the code path of `ckptctl reshard`, in-process) to
// TP=4 x DP=1 and to a 3-rank uneven layout, and times a dd-style O_DIRECT sequential write and
// read of the same size. Prints a table; optionally verifies every destination element.
//
//   bazel run -c opt //tools/bench:reshard_benchmark -- --dir=/tmp/rb --size_mb=1200 [--direct]
//       [--budget_mb=1024] [--threads=4] [--no_overlap] [--verify]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/numbers.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "reshard/offline_reshard.h"
#include "storage/file_util.h"

namespace ckpt {
namespace {

struct Config {
  std::string dir = "/tmp/ckpt_reshard_benchmark";
  int64_t size_mb = 1200;
  int64_t budget_mb = 1024;
  int threads = 4;
  bool direct = false;
  bool verify = false;
  bool overlap = true;
};

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "reshard_benchmark: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

// dd if=/dev/zero of=F bs=16M oflag=direct conv=fsync, then dd if=F of=/dev/null bs=16M
// iflag=direct: one thread, one request at a time. Returns {write s, read s}.
std::pair<double, double> DdStyle(const std::string& path, int64_t bytes) {
  const int64_t bs = int64_t{16} << 20;
  char* buf = static_cast<char*>(std::aligned_alloc(4096, bs));
  for (int64_t i = 0; i < bs; ++i) buf[i] = static_cast<char>(i * 131);
  const double w = Seconds([&] {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) Die(ErrnoStatus(errno, "open " + path), "dd write");
    for (int64_t off = 0; off < bytes; off += bs) {
      if (::pwrite(fd, buf, bs, off) != bs) Die(ErrnoStatus(errno, "pwrite"), "dd write");
    }
    ::fsync(fd);
    ::close(fd);
  });
  const double r = Seconds([&] {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) Die(ErrnoStatus(errno, "open " + path), "dd read");
    for (int64_t off = 0; off < bytes; off += bs) {
      if (::pread(fd, buf, bs, off) != bs) Die(ErrnoStatus(errno, "pread"), "dd read");
    }
    ::close(fd);
  });
  std::free(buf);
  ::unlink(path.c_str());
  return {w, r};
}

void Row(const char* what, int64_t bytes, double seconds, const char* note = "") {
  std::printf("| %-44s | %8.1f | %7.2f | %6.2f | %s\n", what, bytes / 1e6, seconds,
              bytes / seconds / 1e9, note);
}

int Main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      const std::string p = std::string("--") + name + "=";
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    const char* v;
    bool ok = true;
    if ((v = val("dir"))) {
      c.dir = v;
    } else if ((v = val("size_mb"))) {
      ok = absl::SimpleAtoi(v, &c.size_mb) && c.size_mb > 0;
    } else if ((v = val("budget_mb"))) {
      ok = absl::SimpleAtoi(v, &c.budget_mb) && c.budget_mb > 0;
    } else if ((v = val("threads"))) {
      ok = absl::SimpleAtoi(v, &c.threads) && c.threads > 0;
    } else if (a == "--direct") {
      c.direct = true;
    } else if (a == "--no_overlap") {
      c.overlap = false;
    } else if (a == "--verify") {
      c.verify = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "reshard_benchmark: bad argument %s\n", a.c_str());
      return 2;
    }
  }
  Die(RemoveTree(c.dir), "clean dir");
  Die(MakeDir(c.dir, /*exist_ok=*/true), "make dir");
  absl::StatusOr<std::vector<TensorMeta>> tensors = GptTensors(GptConfigForBytes(c.size_mb << 20));
  Die(tensors.status(), "tensors");
  const int64_t total = TotalBytes(*tensors);
  const int64_t budget = c.budget_mb << 20;
  IoOptions io;
  io.num_threads = c.threads;
  io.direct_io = c.direct;

  auto layout = [](const std::string& json) {
    absl::StatusOr<LayoutSpec> s = LayoutSpec::Parse(json);
    Die(s.status(), "layout");
    return *std::move(s);
  };
  const LayoutSpec tp2dp2 = layout(GptLayoutJson(2, 2));
  const LayoutSpec tp4 = layout(GptLayoutJson(4, 1));
  const LayoutSpec uneven3 = layout(R"J({"mesh": {"r": 3}, "rules": [
      {"match": "optimizer.*", "flat": {"over": "r"}},
      {"regex": ".*\\.weight", "placements": ["Shard(-1)"]},
      {"match": "*", "placements": ["Replicate()"]}]})J");

  std::printf("GPT state: %zu tensors, %.1f MB; memory budget %lld MiB, %d I/O threads, %s, %s\n\n",
              tensors->size(), total / 1e6, static_cast<long long>(c.budget_mb), c.threads,
              c.direct ? "O_DIRECT" : "buffered I/O",
              c.overlap ? "reads overlapped with writes" : "reads then writes");
  std::printf("| %-44s | %8s | %7s | %6s |\n", "step", "MB", "s", "GB/s");
  std::printf("|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(10, '-').c_str(),
              std::string(9, '-').c_str(), std::string(8, '-').c_str());

  const auto [dd_w, dd_r] = DdStyle(JoinPath(c.dir, "dd.bin"), (total >> 24) << 24);
  const int64_t dd_bytes = (total >> 24) << 24;
  Row("disk: dd-style O_DIRECT seq write (fsync)", dd_bytes, dd_w);
  Row("disk: dd-style O_DIRECT seq read", dd_bytes, dd_r);
  Row("disk: read + write of the same bytes", dd_bytes, dd_w + dd_r, "(copy bound)");

  WriteOptions wopts;
  wopts.io = io;
  const std::string src = JoinPath(c.dir, "src_tp2dp2");
  absl::StatusOr<WaveWriteStats> written;
  const double t_save = Seconds(
      [&] { written = WriteGptCheckpoint(src, *tensors, tp2dp2, budget / 2, wopts, 1, {}); });
  Die(written.status(), "write source");
  Row("generate + save TP2xDP2 (fill incl.)", total, t_save);
  Row("  of which writing data files", total, written->write_seconds);

  struct Case {
    const char* name;
    const LayoutSpec* target;
    const char* dir;
  };
  for (const Case& k : {Case{"reshard TP2xDP2 -> TP4xDP1", &tp4, "dst_tp4"},
                        Case{"reshard TP2xDP2 -> 3-rank uneven", &uneven3, "dst_3"}}) {
    const char* name = k.name;
    const LayoutSpec* target = k.target;
    OfflineReshardOptions o;
    o.memory_budget_bytes = budget;
    o.io = io;
    o.overlap = c.overlap;
    const std::string dst = JoinPath(c.dir, k.dir);
    absl::StatusOr<OfflineReshardStats> stats;
    const double t = Seconds([&] { stats = OfflineReshard(src, dst, *target, o); });
    Die(stats.status(), name);
    char note[200];
    std::snprintf(note, sizeof(note),
                  "read %.0f MB in %.2f s (fill %.2f s), write %.2f s, commit %.2f s, plan %.2f s, "
                  "%lld waves, peak %.0f MB",
                  stats->bytes_read / 1e6, stats->read_seconds, stats->write.fill_seconds,
                  stats->write.write_seconds, stats->write.commit_seconds, stats->plan_seconds,
                  static_cast<long long>(stats->write.waves),
                  (stats->write.peak_wave_bytes + stats->peak_staging_bytes) / 1e6);
    Row(name, total, t, note);
    if (c.verify) {
      absl::StatusOr<GptCheckReport> check;
      const double tv = Seconds([&] { check = CheckGptCheckpoint(dst, *tensors, *target); });
      Die(check.status(), "verify");
      Row("  verify every element (read + compare)", check->bytes, tv);
    }
    Die(RemoveTree(dst), "cleanup");
  }
  Die(RemoveTree(c.dir), "cleanup");
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
