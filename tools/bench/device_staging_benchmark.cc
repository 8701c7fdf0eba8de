// D2H staging throughput of the worker's pipeline against the pinned cudaMemcpy peak, measured
// in the same run on the same GPU (issue 13's target: staging >= 80% of the peak). NOT YET RUN:
// written on a machine without a GPU; tools/gpu_suite.sh runs it on one.
//
//   device_staging_benchmark [--bytes 4294967296] [--budget 536870912] [--chunk 8388608]
//                            [--reps 5] [--gpu 0] [--dir /tmp]
// Prints one line per measurement: "<what> bytes=<n> seconds=<best> gbps=<GB/s>", then
// "ratio staging/peak=<r>" for the no-op consumer (pure staging), the snapshot consumer (a
// memcpy into pageable memory, as saves did before streaming) and the data-file consumer (each
// chunk written and hashed into a data file in --dir with storage's DataFileStream, fsynced at
// the end, as a save's device pieces are now; disk-bound, so compare it with the disk too).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "device/cuda_copy_engine.h"
#include "storage/data_file_stream.h"
#include "storage/file_util.h"
#include "worker/staging_pipeline.h"

namespace {

int64_t Flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    int64_t v = 0;
    if (name == argv[i] && absl::SimpleAtoi(argv[i + 1], &v)) return v;
  }
  return fallback;
}

std::string FlagString(int argc, char** argv, const std::string& name, std::string fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

// A staging directory with data/ under `dir` for the data-file consumer's files.
std::string BenchStagingDir(const std::string& dir) {
  const std::string staging = ckpt::JoinPath(dir, "device_staging_benchmark.staging");
  (void)ckpt::RemoveTree(staging);
  (void)ckpt::MakeDir(staging);
  (void)ckpt::MakeDir(ckpt::JoinPath(staging, "data"));
  return staging;
}

double Report(const char* what, int64_t bytes, double seconds) {
  const double gbps = static_cast<double>(bytes) / seconds / 1e9;
  std::printf("%s bytes=%ld seconds=%.4f gbps=%.2f\n", what, static_cast<long>(bytes), seconds,
              gbps);
  std::fflush(stdout);
  return gbps;
}

enum Consumer { kNoop, kSnapshot, kDataFile };

// One staging of `range` into `consumer` (the data file: one 1-D u8 tensor "bench" stored whole
// in <staging>/data/r0_0.safetensors, fsynced); keeps the best total and until-drained times.
absl::Status StageOnce(ckpt::worker::PinnedStagingPool& pool,
                       const ckpt::worker::DeviceRange& range, Consumer consumer, char* heap,
                       const std::string& staging, double* best, double* drained) {
  CKPT_ASSIGN_OR_RETURN(auto lease, pool.Acquire(absl::InfiniteFuture()));
  const std::vector<ckpt::TensorMeta> tensors = {{"bench", ckpt::DType::kU8, {range.bytes}}};
  const ckpt::DataFilePlan plan{
      0, {{"bench", {{0}, {range.bytes}, std::nullopt}, nullptr, range.bytes}}};
  ckpt::worker::StagingStats stats;
  const absl::Time start = absl::Now();
  std::unique_ptr<ckpt::DataFileStream> file;
  if (consumer == kDataFile) {
    CKPT_ASSIGN_OR_RETURN(file, ckpt::DataFileStream::Create(staging, tensors, plan, 0));
  }
  CKPT_RETURN_IF_ERROR(ckpt::worker::StageDeviceToHost(
      lease, {&range, 1}, "benchmark", nullptr,
      [&](const ckpt::worker::StagedChunk& c) {
        if (consumer == kSnapshot) std::memcpy(heap + c.offset, c.host, c.bytes);
        if (consumer == kDataFile) return file->Append(0, c.host, c.bytes);
        return absl::OkStatus();
      },
      nullptr, absl::InfiniteFuture(), &stats));
  if (file != nullptr) CKPT_RETURN_IF_ERROR(file->Finish().status());
  *best = std::min(*best, absl::ToDoubleSeconds(absl::Now() - start));
  *drained = std::min(*drained, absl::ToDoubleSeconds(stats.until_drained));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t bytes = Flag(argc, argv, "--bytes", int64_t{4} << 30);
  const int64_t budget = Flag(argc, argv, "--budget", int64_t{512} << 20);
  const int64_t chunk = Flag(argc, argv, "--chunk", int64_t{8} << 20);
  const int reps = static_cast<int>(Flag(argc, argv, "--reps", 5));
  const int gpu = static_cast<int>(Flag(argc, argv, "--gpu", 0));
  auto engine = ckpt::CudaCopyEngine::Create(gpu);
  if (!engine.ok()) {
    std::fprintf(stderr, "device_staging_benchmark: %s\n", engine.status().ToString().c_str());
    return 2;
  }
  cudaSetDevice(gpu);
  void* device = nullptr;
  if (cudaMalloc(&device, bytes) != cudaSuccess) {
    std::fprintf(stderr, "device_staging_benchmark: cudaMalloc(%ld) failed\n",
                 static_cast<long>(bytes));
    return 2;
  }
  cudaMemset(device, 0x5a, bytes);
  cudaDeviceSynchronize();
  // The limit: one cudaMemcpy into one pinned buffer as large as the state.
  void* pinned = nullptr;
  if (cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault) != cudaSuccess) {
    std::fprintf(stderr, "device_staging_benchmark: cudaHostAlloc(%ld) failed\n",
                 static_cast<long>(bytes));
    return 2;
  }
  double peak = 1e30;
  for (int r = 0; r < reps; ++r) {
    const absl::Time start = absl::Now();
    cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost);
    peak = std::min(peak, absl::ToDoubleSeconds(absl::Now() - start));
  }
  cudaFreeHost(pinned);
  const double peak_gbps = Report("pinned_cudamemcpy_peak", bytes, peak);

  ckpt::worker::PinnedStagingPool pool(engine->get(), budget, chunk);
  std::unique_ptr<char[]> heap(new char[bytes]);
  std::memset(heap.get(), 0, bytes);  // fault the pages in before timing
  const ckpt::worker::DeviceRange range{"bench", device, bytes};
  const std::string staging = BenchStagingDir(FlagString(argc, argv, "--dir", "/tmp"));
  for (const int mode : {kNoop, kSnapshot, kDataFile}) {
    double best = 1e30, drained = 1e30;
    for (int r = 0; r < reps; ++r) {
      absl::Status s =
          StageOnce(pool, range, static_cast<Consumer>(mode), heap.get(), staging, &best, &drained);
      if (!s.ok()) {
        std::fprintf(stderr, "device_staging_benchmark: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const char* whats[] = {"staging_noop_consumer", "staging_into_snapshot",
                           "staging_into_data_file"};
    const char* drained_whats[] = {"staging_noop_until_drained",
                                   "staging_into_snapshot_until_drained",
                                   "staging_into_data_file_until_drained"};
    const char* what = whats[mode];
    const double gbps = Report(what, bytes, best);
    Report(drained_whats[mode], bytes, drained);
    std::printf("ratio %s/peak=%.3f (budget=%ld chunk=%ld buffers=%d)\n", what, gbps / peak_gbps,
                static_cast<long>(budget), static_cast<long>(pool.chunk_bytes()),
                pool.num_buffers());
  }
  (void)ckpt::RemoveTree(staging);
  cudaFree(device);
  return 0;
}
