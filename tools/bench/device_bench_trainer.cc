// One trainer rank with a large CUDA state, saved and loaded through ckpt's C++ client, for
// tools/bench/device_dcp_bench.py (issue 13: end-to-end ckpt against DCP on the same data).
// NOT YET RUN: written on a machine without a GPU.
//
//   device_bench_trainer --worker unix:/path --dir D [--bytes 8589934592] [--tensors 32]
//                        [--reps 2] [--gpu 0] [--algorithm direct]
// The state: --tensors int32 tensors of --bytes / --tensors bytes each, one cudaMalloc each,
// element i of tensor t = i ^ (t * 0x01010101) (device_dcp_bench.py builds the same in torch).
// Per repetition: Save into D/ckpt-<rep> (timed until Save returns: what the trainer waits
// for, and until WaitDurable: committed), zero the tensors, evict the checkpoint's files from
// the page cache (they are fsynced), Load (timed) and check every element. Prints one JSON
// line per repetition:
//   {"rep":0,"bytes":...,"save_blocking_s":...,"save_durable_s":...,"load_s":...,
//    "verified":true}
// and exits non-zero on any error or mismatch.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "storage/file_util.h"

namespace {

struct Flags {
  std::string worker, dir, algorithm = "direct";
  int64_t bytes = int64_t{8} << 30;
  int tensors = 32, reps = 2, gpu = 0;
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    int64_t n = 0;
    if (k == "--worker") {
      f.worker = v;
    } else if (k == "--dir") {
      f.dir = v;
    } else if (k == "--algorithm") {
      f.algorithm = v;
    } else if (absl::SimpleAtoi(v, &n) && k == "--bytes") {
      f.bytes = n;
    } else if (absl::SimpleAtoi(v, &n) && k == "--tensors") {
      f.tensors = static_cast<int>(n);
    } else if (absl::SimpleAtoi(v, &n) && k == "--reps") {
      f.reps = static_cast<int>(n);
    } else if (absl::SimpleAtoi(v, &n) && k == "--gpu") {
      f.gpu = static_cast<int>(n);
    } else {
      return false;
    }
  }
  return !f.worker.empty() && !f.dir.empty() && f.tensors > 0 && f.bytes >= 4 * f.tensors;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "device_bench_trainer: %s\n", what.c_str());
  return 1;
}

// Tensor t's host image: element i = i ^ (t * 0x01010101).
void Fill(std::vector<int32_t>& host, int t) {
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = static_cast<int32_t>(i) ^ static_cast<int32_t>(t * 0x01010101);
  }
}

// Drops the checkpoint's (fsynced, so clean) pages from the page cache: loads read the disk.
void Evict(const std::string& path) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (!entry.is_regular_file()) continue;
    const int fd = open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

int Run(const Flags& f) {
  if (cudaSetDevice(f.gpu) != cudaSuccess) return Fail("cannot use the GPU");
  ckpt::client::Options options;
  options.worker_address = f.worker;
  options.job = "device-bench";
  options.rank = 0;
  options.world_size = 1;
  options.local_rank = 0;
  auto client = ckpt::client::Client::Connect(options);
  if (!client.ok()) return Fail(client.status().ToString());
  auto state = (*client)->NewStateDict();
  const int64_t elements = f.bytes / 4 / f.tensors;
  const int64_t tensor_bytes = elements * 4;
  std::vector<void*> device(f.tensors, nullptr);
  std::vector<int32_t> host(elements);
  for (int t = 0; t < f.tensors; ++t) {
    if (cudaMalloc(&device[t], tensor_bytes) != cudaSuccess) return Fail("cudaMalloc failed");
    Fill(host, t);
    cudaMemcpy(device[t], host.data(), tensor_bytes, cudaMemcpyHostToDevice);
    ckpt::client::TensorDeclaration spec{absl::StrCat("t", t),
                                         ckpt::DType::kI32,
                                         {elements},
                                         ckpt::Region{{0}, {elements}, {}},
                                         {},
                                         ckpt::client::MemoryKind::kDevice};
    auto added = state->AddDevice(spec, device[t], f.gpu);
    if (!added.ok()) return Fail(added.status().ToString());
  }
  cudaDeviceSynchronize();
  if (absl::Status s = (*client)->Share(*state); !s.ok()) return Fail(s.ToString());
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::string path = absl::StrCat(f.dir, "/ckpt-", rep);
    (void)ckpt::RemoveTree(path);
    const absl::Time save_start = absl::Now();
    auto handle = (*client)->Save(path, *state);
    if (!handle.ok()) return Fail(handle.status().ToString());
    const double blocking = Seconds(save_start);
    if (absl::Status s = (*handle)->WaitDurable(absl::Minutes(30)); !s.ok()) {
      return Fail(s.ToString());
    }
    const double durable = Seconds(save_start);
    for (void* d : device) cudaMemset(d, 0, tensor_bytes);
    cudaDeviceSynchronize();
    Evict(path);
    ckpt::client::LoadOptions load;
    load.exchange_algorithm = f.algorithm;
    const absl::Time load_start = absl::Now();
    if (absl::Status s = (*client)->Load(path, *state, load); !s.ok()) return Fail(s.ToString());
    const double load_s = Seconds(load_start);
    std::vector<int32_t> got(elements);
    for (int t = 0; t < f.tensors; ++t) {
      Fill(host, t);
      cudaMemcpy(got.data(), device[t], tensor_bytes, cudaMemcpyDeviceToHost);
      if (got != host) return Fail(absl::StrCat("tensor t", t, " differs after the load"));
    }
    std::printf(
        "{\"rep\":%d,\"bytes\":%ld,\"save_blocking_s\":%.4f,\"save_durable_s\":%.4f,"
        "\"load_s\":%.4f,\"verified\":true}\n",
        rep, static_cast<long>(tensor_bytes * f.tensors), blocking, durable, load_s);
    std::fflush(stdout);
    (void)ckpt::RemoveTree(path);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: device_bench_trainer --worker unix:/path --dir D [--bytes N] "
                 "[--tensors T] [--reps R] [--gpu G] [--algorithm direct]\n");
    return 2;
  }
  return Run(flags);
}
