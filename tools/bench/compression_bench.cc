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
//   compression_bench pipelined <file.safetensors> <dir> <compression> <runs> <lend 0|1>
//     the worker's save of the same tensors shared by a trainer (a shared-memory segment
//     registered in a MemoryRegistry session; lent until durable with lend 1): SnapshotSavePart
//     through a prefaulted host pool (1 GiB, as --host_pool_prefault) + WriteSnapshot + the
//     commit, `runs` times into <dir>/pipelined-<run>; reads the last one back through
//     CheckpointReader and checks every byte; prints one JSON line: the first and best seconds
//     to durable (committed), the best snapshot seconds, file bytes and how the files were
//     written (SnapshotReport).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/piece_compression.h"
#include "storage/safetensors.h"
#include "worker/host_buffer_pool.h"
#include "worker/memory_registry.h"
#include "worker/save_executor.h"

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

// The file's tensors in a shared-memory segment, registered as a trainer shares them.
class SharedTrainer {
 public:
  ~SharedTrainer() {
    if (data_ != nullptr) munmap(data_, size_);
    if (!segment_.empty()) shm_unlink(segment_.c_str());
  }
  absl::Status Share(const File& f, bool lend, worker::MemoryRegistry& registry) {
    size_ = std::max<size_t>(f.bytes.size() - f.header.data_start, 1);
    segment_ = absl::StrCat("/ckpt.bench.r0.p", getpid(), ".1");  // as the client names it
    shm_unlink(segment_.c_str());
    const int fd = shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size_)) != 0) {
      return absl::InternalError(absl::StrCat("cannot make shared memory ", segment_));
    }
    void* m = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return absl::InternalError("cannot map the shared memory");
    data_ = static_cast<char*>(m);
    std::memcpy(data_, f.bytes.data() + f.header.data_start, f.bytes.size() - f.header.data_start);
    CKPT_ASSIGN_OR_RETURN(std::string id, registry.OpenSession({"bench", 0, 1, 0, getpid()}));
    std::vector<pb::SharedTensor> tensors;
    for (const SafetensorsEntry& e : f.header.entries) {
      pb::SharedTensor t;
      t.mutable_shard()->mutable_tensor()->set_key(e.name);
      t.mutable_shard()->mutable_tensor()->set_dtype(DTypeToProto(e.dtype));
      for (int64_t d : e.shape) {
        t.mutable_shard()->mutable_tensor()->add_global_shape(d);
        t.mutable_shard()->mutable_region()->add_offsets(0);
        t.mutable_shard()->mutable_region()->add_lengths(d);
      }
      t.set_memory_kind(pb::MEMORY_HOST);
      t.set_segment(segment_);
      t.set_offset(e.begin);
      t.set_nbytes(e.end - e.begin);
      t.set_lent_until_durable(lend);
      tensors.push_back(t);
    }
    CKPT_RETURN_IF_ERROR(registry.RegisterTensors(id, tensors));
    CKPT_ASSIGN_OR_RETURN(session_, registry.Find(id));
    return absl::OkStatus();
  }
  const worker::SessionInfo& session() const { return session_; }

 private:
  std::string segment_;
  char* data_ = nullptr;
  size_t size_ = 0;
  worker::SessionInfo session_;
};

pb::SavePlanPart PlanPart(const File& f, const std::string& staging, const std::string& spec) {
  pb::SavePlanPart part;
  part.set_staging_dir(staging);
  part.set_compression(spec);
  pb::PlanFile* file = part.add_files();
  file->set_path("data/r0_0.safetensors");
  for (size_t i = 0; i < f.header.entries.size(); ++i) {
    pb::PlanPiece* p = file->add_pieces();
    p->set_size_bytes(f.header.entries[i].end - f.header.entries[i].begin);
    p->set_local_index(static_cast<int>(i));
    part.set_total_bytes(part.total_bytes() + p->size_bytes());
  }
  return part;
}

// One pipelined save of `trainer`'s state committed at `path`: seconds to the snapshot and to
// durable; the report and the file bytes.
struct PipelinedRun {
  double snapshot_s = 0;
  double durable_s = 0;
  worker::SnapshotReport report;
  int64_t file_bytes = 0;
};

absl::StatusOr<PipelinedRun> SavePipelined(const File& f, const SharedTrainer& trainer,
                                           worker::HostBufferPool& pool, const std::string& path,
                                           const std::string& spec) {
  PipelinedRun run;
  const double t0 = Now();
  CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(path, false));
  worker::MemoryGate gate;
  worker::DeviceSnapshotOptions options;
  options.host_pool = &pool;
  CKPT_ASSIGN_OR_RETURN(
      worker::SaveSnapshot snapshot,
      worker::SnapshotSavePart(PlanPart(f, staging, spec), trainer.session(), gate, options));
  run.snapshot_s = Now() - t0;
  CKPT_ASSIGN_OR_RETURN(std::string written, worker::WriteSnapshot(snapshot, nullptr));
  pb::Manifest m;
  if (!m.ParseFromString(written)) return absl::InternalError("unreadable written record");
  WrittenData data;
  for (const pb::StoredPiece& p : m.pieces()) data.pieces.push_back(p);
  for (const pb::DataFile& df : m.files()) {
    data.files.push_back(df);
    run.file_bytes += df.size_bytes();
  }
  std::vector<TensorMeta> metas;
  for (const SafetensorsEntry& e : f.header.entries) metas.push_back({e.name, e.dtype, e.shape});
  const pb::Manifest manifest =
      BuildManifest(metas, std::move(data), CheckpointContents(), kDefaultChecksumBlockBytes);
  CKPT_RETURN_IF_ERROR(CommitCheckpoint(staging, path, manifest, WriteOptions()));
  run.durable_s = Now() - t0;
  run.report = snapshot.report;
  return run;
}

// Every tensor of the checkpoint at `path` equals the file's bytes.
absl::Status CheckReadsBack(const File& f, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  std::string out;
  for (const SafetensorsEntry& e : f.header.entries) {
    out.assign(static_cast<size_t>(e.end - e.begin), '\0');
    const Region whole{std::vector<int64_t>(e.shape.size(), 0), e.shape, std::nullopt};
    CKPT_RETURN_IF_ERROR(reader->ReadRegion(e.name, whole, out.data()));
    if (out.compare(0, out.size(), f.bytes, f.header.data_start + e.begin, out.size()) != 0) {
      return absl::DataLossError(absl::StrCat(e.name, " did not read back bit-exact"));
    }
  }
  return absl::OkStatus();
}

absl::Status Pipelined(const File& f, const std::string& dir, const std::string& spec, int runs,
                       bool lend) {
  worker::MemoryRegistry registry;
  SharedTrainer trainer;
  CKPT_RETURN_IF_ERROR(trainer.Share(f, lend, registry));
  worker::HostBufferPool pool(int64_t{1} << 30);
  CKPT_RETURN_IF_ERROR(pool.Prefault());
  double first = 0, best = 1e30, best_snapshot = 1e30;
  PipelinedRun last;
  std::string path;
  for (int r = 0; r < std::max(runs, 1); ++r) {
    if (!path.empty()) CKPT_RETURN_IF_ERROR(RemoveTree(path));  // the bench's own checkpoint
    path = JoinPath(dir, absl::StrCat("pipelined-", r));
    CKPT_ASSIGN_OR_RETURN(last, SavePipelined(f, trainer, pool, path, spec));
    if (r == 0) first = last.durable_s;
    best = std::min(best, last.durable_s);
    best_snapshot = std::min(best_snapshot, last.snapshot_s);
  }
  CKPT_RETURN_IF_ERROR(CheckReadsBack(f, path));
  const worker::SnapshotReport& rep = last.report;
  std::printf(
      "{\"first_s\": %.6f, \"seconds\": %.6f, \"snapshot_s\": %.6f, \"file_bytes\": %lld, "
      "\"raw_bytes\": %lld, \"compression_pipelined\": %s, \"compressed_files\": %d, "
      "\"direct_io_files\": %d, \"buffered_files\": %d, \"copied_bytes\": %lld, "
      "\"lent_bytes\": %lld, \"bit_exact\": true}\n",
      first, best, best_snapshot, static_cast<long long>(last.file_bytes),
      static_cast<long long>(f.bytes.size() - f.header.data_start),
      rep.compression_pipelined ? "true" : "false", rep.compressed_files, rep.direct_io_files,
      rep.buffered_files, static_cast<long long>(rep.copied_bytes),
      static_cast<long long>(rep.lent_bytes));
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
  } else if (mode == "pipelined" && argc == 7 && absl::SimpleAtoi(argv[5], &a) &&
             absl::SimpleAtoi(argv[6], &b)) {
    absl::StatusOr<File> f = Load(argv[2]);
    s = f.ok() ? Pipelined(*f, argv[3], argv[4], a, b != 0) : f.status();
  } else {
    std::fprintf(stderr,
                 "usage: compression_bench codec <file> <threads> <level> <chunk> <repeats>\n"
                 "       compression_bench save <file> <dir> <threads> <compression>\n"
                 "       compression_bench pipelined <file> <dir> <compression> <runs> <lend>\n");
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
