// The worker's save of host tensors, measured against the machine's limits in the same run:
//   - memcpy of the same bytes into touched memory and into freshly mapped memory;
//   - dd writing the same bytes with O_DIRECT and an fsync (`dd oflag=direct conv=fsync`);
//   - the save as the worker runs it (SnapshotSavePart + WriteSnapshot), through the host pool
//     (pipelined, O_DIRECT) cold (the pool's first save) and warm (later saves), and the old
//     path (no pool: fresh buffers, buffered writes after the whole snapshot).
// Prints, per row, the snapshot's GB/s (what the trainer's Save waits for) and save-to-durable
// GB/s (data files written and fsynced).
//
//   save_pipeline_benchmark --dir /path/on/the/disk [--mib 1024] [--tensors 8] [--runs 3]
//                           [--pool_mib 2048]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "worker/host_buffer_pool.h"
#include "worker/save_executor.h"

ABSL_FLAG(std::string, dir, "", "a directory on the disk to measure (required)");
ABSL_FLAG(int64_t, mib, 1024, "MiB saved");
ABSL_FLAG(int, tensors, 8, "tensors the bytes are split into");
ABSL_FLAG(int, runs, 3, "warm saves through the pool (after the cold one)");
ABSL_FLAG(int64_t, pool_mib, 2048, "the host pool's bound");

namespace {

using ckpt::worker::DeviceSnapshotOptions;
using ckpt::worker::HostBufferPool;
using ckpt::worker::MemoryGate;
using ckpt::worker::MemoryRegistry;
using ckpt::worker::SessionInfo;

double GBps(int64_t bytes, absl::Duration d) { return bytes / absl::ToDoubleSeconds(d) / 1e9; }

// The trainer's state: `n` u8 tensors in one shared segment, registered in a session.
struct Trainer {
  std::string segment;
  char* data = nullptr;
  int64_t bytes = 0;
  SessionInfo session;
};

Trainer Register(MemoryRegistry& registry, int64_t bytes, int n) {
  Trainer t;
  t.bytes = bytes;
  t.segment = absl::StrCat("/ckpt.savebench.p", getpid(), ".1");
  shm_unlink(t.segment.c_str());
  const int fd = shm_open(t.segment.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, bytes) != 0) std::abort();
  t.data = static_cast<char*>(
      mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(t.data + i, &v, 8);
  }
  auto id = registry.OpenSession({"bench", 0, 1, 0, getpid()});
  std::vector<ckpt::pb::SharedTensor> tensors;
  const int64_t each = bytes / n;
  for (int i = 0; i < n; ++i) {
    ckpt::pb::SharedTensor s;
    const int64_t size = i + 1 == n ? bytes - each * (n - 1) : each;
    s.mutable_shard()->mutable_tensor()->set_key(absl::StrCat("layer", i, ".w"));
    s.mutable_shard()->mutable_tensor()->set_dtype(ckpt::pb::DTYPE_U8);
    s.mutable_shard()->mutable_tensor()->add_global_shape(size);
    s.mutable_shard()->mutable_region()->add_offsets(0);
    s.mutable_shard()->mutable_region()->add_lengths(size);
    s.set_memory_kind(ckpt::pb::MEMORY_HOST);
    s.set_segment(t.segment);
    s.set_offset(each * i);
    s.set_nbytes(size);
    tensors.push_back(s);
  }
  if (!id.ok() || !registry.RegisterTensors(*id, tensors).ok()) std::abort();
  t.session = *registry.Find(*id);
  return t;
}

ckpt::pb::SavePlanPart Part(const Trainer& t, const std::string& staging) {
  ckpt::pb::SavePlanPart part;
  part.set_staging_dir(staging);
  ckpt::pb::PlanFile* file = part.add_files();
  file->set_path("data/r0_0.safetensors");
  for (size_t i = 0; i < t.session.tensors.size(); ++i) {
    ckpt::pb::PlanPiece* p = file->add_pieces();
    p->set_size_bytes(t.session.tensors[i].nbytes);
    p->set_local_index(static_cast<int>(i));
  }
  return part;
}

// One save: the snapshot's and the whole save's durations.
struct SaveTimes {
  absl::Duration snapshot;
  absl::Duration durable;
  std::string io;
};

SaveTimes SaveOnce(const Trainer& t, const std::string& dir, HostBufferPool* pool, int run) {
  auto staging = ckpt::CreateStagingDir(absl::StrCat(dir, "/bench-ckpt-", run), true);
  if (!staging.ok()) std::abort();
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = pool;
  const absl::Time start = absl::Now();
  auto snapshot = ckpt::worker::SnapshotSavePart(Part(t, *staging), t.session, gate, options);
  SaveTimes times;
  times.snapshot = absl::Now() - start;
  if (!snapshot.ok()) {
    std::fprintf(stderr, "%s\n", snapshot.status().ToString().c_str());
    std::exit(1);
  }
  auto written = ckpt::worker::WriteSnapshot(*snapshot, nullptr);
  times.durable = absl::Now() - start;
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    std::exit(1);
  }
  times.io = snapshot->report.direct_io_files > 0 ? "O_DIRECT" : "buffered";
  snapshot = absl::CancelledError("done");
  (void)ckpt::DiscardStagingDir(*staging);
  return times;
}

absl::Duration Memcpy(char* dst, const char* src, int64_t bytes) {
  const absl::Time start = absl::Now();
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::Now() - start;
}

absl::Duration Dd(const std::string& dir, int64_t mib) {
  const std::string file = dir + "/bench-dd";
  const std::string cmd = absl::StrCat("dd if=/dev/zero of=", file, " bs=1M count=", mib,
                                       " oflag=direct conv=fsync status=none");
  const absl::Time start = absl::Now();
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "dd failed\n");
  const absl::Duration d = absl::Now() - start;
  ::unlink(file.c_str());
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "--dir is required\n");
    return 2;
  }
  const int64_t mib = absl::GetFlag(FLAGS_mib);
  const int64_t bytes = mib << 20;
  MemoryRegistry registry;
  Trainer t = Register(registry, bytes, absl::GetFlag(FLAGS_tensors));

  std::vector<char> touched(static_cast<size_t>(bytes), 1);  // touched once here
  const absl::Duration to_touched = Memcpy(touched.data(), t.data, bytes);
  std::unique_ptr<char[]> fresh(new char[static_cast<size_t>(bytes)]);
  const absl::Duration to_fresh = Memcpy(fresh.get(), t.data, bytes);
  fresh.reset();
  const absl::Duration dd = Dd(dir, mib);

  std::printf("%-44s %10s %10s %s\n", "row", "snap GB/s", "dur. GB/s", "vs limit");
  std::printf("%-44s %10.2f %10s\n", "memcpy into touched memory", GBps(bytes, to_touched), "");
  std::printf("%-44s %10.2f %10s\n", "memcpy into fresh memory", GBps(bytes, to_fresh), "");
  std::printf("%-44s %10s %10.2f\n", "dd oflag=direct conv=fsync", "", GBps(bytes, dd));
  auto row = [&](const std::string& name, const SaveTimes& s) {
    std::printf("%-44s %10.2f %10.2f snapshot %.0f%% of memcpy, durable %.0f%% of dd (%s)\n",
                name.c_str(), GBps(bytes, s.snapshot), GBps(bytes, s.durable),
                100 * absl::ToDoubleSeconds(to_touched) / absl::ToDoubleSeconds(s.snapshot),
                100 * absl::ToDoubleSeconds(dd) / absl::ToDoubleSeconds(s.durable), s.io.c_str());
  };
  row("old path (fresh buffers, write after)", SaveOnce(t, dir, nullptr, 0));
  HostBufferPool pool(absl::GetFlag(FLAGS_pool_mib) << 20);
  row("pool, cold (first save)", SaveOnce(t, dir, &pool, 1));
  for (int r = 0; r < absl::GetFlag(FLAGS_runs); ++r) {
    row(absl::StrCat("pool, warm (save ", r + 2, ")"), SaveOnce(t, dir, &pool, r + 2));
  }
  std::printf("pool: %lld chunks of %lld bytes mapped, huge pages %s\n",
              static_cast<long long>(pool.stats().chunks_mapped),
              static_cast<long long>(pool.stats().chunk_bytes),
              pool.stats().huge_pages ? "yes" : "no");
  munmap(t.data, static_cast<size_t>(bytes));
  shm_unlink(t.segment.c_str());
  return 0;
}
