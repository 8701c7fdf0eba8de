// D2H staging throughput of the worker's pipeline against the pinned cudaMemcpy peak, measured
// in the same run on the same GPU (issue 13's target: staging >= 80% of the peak). NOT YET RUN:
// written on a machine without a GPU; tools/gpu_suite.sh runs it on one.
//
//   device_staging_benchmark [--bytes 4294967296] [--budget 536870912] [--chunk 8388608]
//                            [--reps 5] [--gpu 0]
// Prints one line per measurement: "<what> bytes=<n> seconds=<best> gbps=<GB/s>", then
// "ratio staging/peak=<r>" for the no-op consumer (pure staging) and the snapshot consumer
// (a memcpy into pageable memory, as a save does).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "device/cuda_copy_engine.h"
#include "worker/staging_pipeline.h"

namespace {

int64_t Flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    int64_t v = 0;
    if (name == argv[i] && absl::SimpleAtoi(argv[i + 1], &v)) return v;
  }
  return fallback;
}

double Report(const char* what, int64_t bytes, double seconds) {
  const double gbps = static_cast<double>(bytes) / seconds / 1e9;
  std::printf("%s bytes=%ld seconds=%.4f gbps=%.2f\n", what, static_cast<long>(bytes), seconds,
              gbps);
  std::fflush(stdout);
  return gbps;
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
  for (const bool snapshot : {false, true}) {
    double best = 1e30, drained = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto lease = pool.Acquire(absl::InfiniteFuture());
      if (!lease.ok()) {
        std::fprintf(stderr, "device_staging_benchmark: %s\n", lease.status().ToString().c_str());
        return 2;
      }
      ckpt::worker::StagingStats stats;
      const absl::Time start = absl::Now();
      absl::Status s = ckpt::worker::StageDeviceToHost(
          *lease, {&range, 1}, "benchmark", nullptr,
          [&](const ckpt::worker::StagedChunk& c) {
            if (snapshot) std::memcpy(heap.get() + c.offset, c.host, c.bytes);
            return absl::OkStatus();
          },
          nullptr, absl::InfiniteFuture(), &stats);
      if (!s.ok()) {
        std::fprintf(stderr, "device_staging_benchmark: %s\n", s.ToString().c_str());
        return 1;
      }
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
      drained = std::min(drained, absl::ToDoubleSeconds(stats.until_drained));
    }
    const char* what = snapshot ? "staging_into_snapshot" : "staging_noop_consumer";
    const double gbps = Report(what, bytes, best);
    Report(snapshot ? "staging_into_snapshot_until_drained" : "staging_noop_until_drained", bytes,
           drained);
    std::printf("ratio %s/peak=%.3f (budget=%ld chunk=%ld buffers=%d)\n", what, gbps / peak_gbps,
                static_cast<long>(budget), static_cast<long>(pool.chunk_bytes()),
                pool.num_buffers());
  }
  cudaFree(device);
  return 0;
}
