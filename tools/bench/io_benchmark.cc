// Storage benchmark: save and load of a few GB of tensors through the checkpoint writer and
// reader, against the machine's own limits measured in the same run: dd-style sequential
// O_DIRECT write and read of the same total size, and memcpy bandwidth. Prints a table.
//
//   bazel run -c opt //tools/bench:io_benchmark -- --dir=/tmp/ckpt_bench --size_mb=2048
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/checksum.h"
#include "storage/file_util.h"

namespace ckpt {
namespace {

struct Config {
  std::string dir = "/tmp/ckpt_bench";
  int64_t size_mb = 2048;
  int tensors = 16;
  int files = 4;
  int threads = 4;
  int queue_depth = 4;
  int64_t buffer_mb = 8;
  bool direct = true;
  int repeat = 3;
  std::string backend = "auto";
};

double Seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "io_benchmark: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

char* AlignedAlloc(int64_t n) {
  return static_cast<char*>(
      std::aligned_alloc(4096, static_cast<size_t>((n + 4095) / 4096 * 4096)));
}

// dd if=/dev/zero of=F bs=16M oflag=direct conv=fsync, in-process: one thread, one request at a
// time, O_DIRECT, fsync at the end.
double SeqWrite(const std::string& path, int64_t bytes, const char* src) {
  const int64_t bs = int64_t{16} << 20;
  return Seconds([&] {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) Die(ErrnoStatus(errno, "open " + path), "seq write");
    for (int64_t off = 0; off < bytes; off += bs) {
      const int64_t n = std::min(bs, bytes - off);
      if (::pwrite(fd, src + off, n, off) != n) Die(ErrnoStatus(errno, "pwrite"), "seq write");
    }
    ::fsync(fd);
    ::close(fd);
  });
}

// dd if=F of=/dev/null bs=16M iflag=direct.
double SeqRead(const std::string& path, int64_t bytes, char* dst) {
  const int64_t bs = int64_t{16} << 20;
  return Seconds([&] {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) Die(ErrnoStatus(errno, "open " + path), "seq read");
    for (int64_t off = 0; off < bytes; off += bs) {
      const int64_t n = std::min(bs, bytes - off);
      if (::pread(fd, dst + off, n, off) != n) Die(ErrnoStatus(errno, "pread"), "seq read");
    }
    ::close(fd);
  });
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      const std::string p = std::string("--") + name + "=";
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    const char* v;
    bool ok = true;
    if ((v = val("dir")))
      c.dir = v;
    else if ((v = val("size_mb")))
      ok = absl::SimpleAtoi(v, &c.size_mb);
    else if ((v = val("tensors")))
      ok = absl::SimpleAtoi(v, &c.tensors);
    else if ((v = val("files")))
      ok = absl::SimpleAtoi(v, &c.files);
    else if ((v = val("threads")))
      ok = absl::SimpleAtoi(v, &c.threads);
    else if ((v = val("queue_depth")))
      ok = absl::SimpleAtoi(v, &c.queue_depth);
    else if ((v = val("buffer_mb")))
      ok = absl::SimpleAtoi(v, &c.buffer_mb);
    else if ((v = val("repeat")))
      ok = absl::SimpleAtoi(v, &c.repeat);
    else if ((v = val("backend")))
      c.backend = v;
    else if (a == "--buffered")
      c.direct = false;
    else if (a == "--help") {
      std::printf(
          "flags: --dir --size_mb --tensors --files --threads --queue_depth --buffer_mb "
          "--repeat --backend=auto|uring|posix --buffered\n");
      return 0;
    } else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "io_benchmark: bad flag %s\n", argv[i]);
      return 2;
    }
  }
  const int64_t total = c.size_mb << 20;
  const int64_t per_tensor = total / c.tensors / 4096 * 4096;
  const int64_t bytes = per_tensor * c.tensors;
  Die(MakeDir(c.dir, true), "mkdir");

  // Tensor data (non-zero, non-repeating enough that nothing can shortcut it).
  char* data = AlignedAlloc(bytes);
  char* back = AlignedAlloc(bytes);
  for (int64_t i = 0; i < bytes; i += 8) {
    uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    std::memcpy(data + i, &x, 8);
  }
  std::memset(back, 1, bytes);  // fault the pages in

  std::vector<double> t_memcpy, t_hash, t_wr, t_rd, t_save, t_save_data, t_load, t_load_nv;
  IoOptions io;
  io.num_threads = c.threads;
  io.queue_depth = c.queue_depth;
  io.buffer_bytes = c.buffer_mb << 20;
  io.direct_io = c.direct;
  io.backend = c.backend == "uring"   ? IoBackend::kUring
               : c.backend == "posix" ? IoBackend::kPosix
                                      : IoBackend::kAuto;
  IoStats save_stats, load_stats;

  CheckpointContents contents;
  std::vector<PieceData> pieces;
  for (int t = 0; t < c.tensors; ++t) {
    const std::string key = absl::StrCat("layers.", t, ".weight");
    const int64_t elems = per_tensor / 2;
    contents.tensors.push_back({key, DType::kBF16, {elems / 1024, 1024}});
    pieces.push_back({key, WholeRegion({elems / 1024, 1024}), data + t * per_tensor, per_tensor});
  }
  contents.files = BalanceIntoFiles(pieces, c.files, 0);
  const std::string seq = JoinPath(c.dir, "seq.bin");
  const std::string ckpt = JoinPath(c.dir, "ckpt");

  for (int r = 0; r < c.repeat; ++r) {
    t_memcpy.push_back(Seconds([&] { std::memcpy(back, data, bytes); }));
    volatile uint64_t sink = 0;
    t_hash.push_back(Seconds([&] { sink = sink + Xxh3(data, bytes); }));
    t_wr.push_back(SeqWrite(seq, bytes, data));
    t_rd.push_back(SeqRead(seq, bytes, back));
    Die(RemoveTree(seq), "rm");

    WriteOptions wo;
    wo.io = io;
    wo.io.stats = &save_stats;
    // A fresh save, as the dd-style write is of a fresh file (replacing a checkpoint would add
    // the removal of the old one, which the writer does only after the new one is committed).
    Die(RemoveTree(ckpt), "rm");
    wo.overwrite = false;
    // Where save time goes: data files (write + checksums + fsync) vs the commit steps.
    std::chrono::steady_clock::time_point t_staged, t_synced;
    wo.after_step = [&](CommitStep step) {
      if (step == CommitStep::kStagingCreated) t_staged = std::chrono::steady_clock::now();
      if (step == CommitStep::kDataFilesSynced) t_synced = std::chrono::steady_clock::now();
    };
    t_save.push_back(Seconds([&] { Die(WriteCheckpoint(ckpt, contents, wo).status(), "save"); }));
    t_save_data.push_back(std::chrono::duration<double>(t_synced - t_staged).count());

    ReaderOptions ro;
    ro.io = io;
    ro.io.stats = &load_stats;
    for (bool verify : {true, false}) {
      std::memset(back, 0, 4096);
      double t = Seconds([&] {
        auto reader = CheckpointReader::Open(ckpt, ro);
        Die(reader.status(), "open");
        std::vector<PieceRead> reads;
        for (int i = 0; i < (*reader)->manifest().pieces_size(); ++i) {
          const pb::StoredPiece& p = (*reader)->manifest().pieces(i);
          const int t = std::atoi(p.key().c_str() + 7);
          reads.push_back({i, 0, p.byte_length(), back + t * per_tensor});
        }
        Die((*reader)->ReadPieces(reads, verify), "load");
      });
      (verify ? t_load : t_load_nv).push_back(t);
      if (std::memcmp(back, data, bytes) != 0) Die(absl::DataLossError("mismatch"), "load");
    }
  }
  Die(RemoveTree(ckpt), "rm");

  const double gb = static_cast<double>(bytes) / 1e9;
  auto bw = [&](const std::vector<double>& t) { return gb / Median(t); };
  std::printf(
      "io_benchmark: %.2f GB in %d BF16 tensors, %d files, %d threads x depth %d, "
      "%lld MiB buffers, %s, backend %s (uring available: %s); median of %d runs\n",
      gb, c.tensors, c.files, c.threads, c.queue_depth, static_cast<long long>(c.buffer_mb),
      c.direct ? "O_DIRECT" : "buffered", c.backend.c_str(), UringAvailable() ? "yes" : "no",
      c.repeat);
  std::printf("save used: %lld uring / %lld posix files, %lld direct, %lld direct fallbacks\n",
              static_cast<long long>(save_stats.uring_files),
              static_cast<long long>(save_stats.posix_files),
              static_cast<long long>(save_stats.direct_files),
              static_cast<long long>(save_stats.direct_fallbacks));
  std::printf("%-34s %10s %10s\n", "measurement", "GB/s", "seconds");
  auto row = [&](const char* name, const std::vector<double>& t) {
    std::printf("%-34s %10.3f %10.3f\n", name, bw(t), Median(t));
  };
  row("memcpy", t_memcpy);
  row("xxh3 (1 thread, in memory)", t_hash);
  row("seq write O_DIRECT (dd-style)", t_wr);
  row("seq read O_DIRECT (dd-style)", t_rd);
  row("save (WriteCheckpoint, committed)", t_save);
  row("  of which data files + fsync", t_save_data);
  row("load (Open + read, verified)", t_load);
  row("load (Open + read, no verify)", t_load_nv);
  std::printf("save / seq write      %6.1f %%   (target >= 90 %%)\n",
              100.0 * bw(t_save) / bw(t_wr));
  std::printf("load / seq read       %6.1f %%   (target >= 90 %%)\n",
              100.0 * bw(t_load) / bw(t_rd));
  std::printf("checksum overhead     %6.1f %%   (verified vs unverified load; target <= 5 %%)\n",
              100.0 * (Median(t_load) - Median(t_load_nv)) / Median(t_load_nv));
  std::free(data);
  std::free(back);
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
