// A trainer rank whose state lives in CUDA memory, for the requires-gpu end-to-end tests (not
// yet run on a GPU: this was written on a machine without one). Two tensors share one
// cudaMalloc allocation (so the worker gets (handle, offset) pairs, as from PyTorch's caching
// allocator) and one host tensor makes the state mixed:
//   "dev.a"  (G * rows, cols) i32, rank r holds rows [r * k * rows, (r + 1) * k * rows)
//   "dev.b"  (G, cols) i32, rank r holds rows [r * k, (r + 1) * k)   (dev.a's allocation)
//   "host.c" (G, 64) i32, rank r holds rows [r * k, (r + 1) * k)     (shared memory)
// where G = --global_ranks (default: the world size) and k = G / world size.
// Every element holds its global flat index xor a per-tensor salt.
// Printed lines (flushed): "shared", "snapshotted device_bytes=N waited_for_writes=0|1
// written_before=N", "mutated", "result <code> <message>",
// "verified <elements>", "mismatch <tensor> <index> <got> <want>".
//
//   device_trainer --worker unix:/path --job J --rank R --world_size N --mode save|load
//                  --path P [--rows 4] [--cols 1024] [--algorithm direct|broadcast]
//                  [--device_only 1]
//                  [--gpu 0] [--global_ranks G]
// --mode save: Save, overwrite every tensor right after Save returns, WaitDurable.
// --mode load: Load into zeroed tensors and check every element. A load with another world
// size than the save is a reshard.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/client.h"

namespace {

void Emit(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Report(const absl::Status& s) {
  Emit("result " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message()));
  return s.ok() ? 0 : 1;
}

struct Flags {
  std::string worker, job, mode, path, algorithm = "direct";
  int rank = 0, world = 1, gpu = 0, global = -1;
  bool device_only = false;  // no host tensor: the state is device-resident
  int64_t rows = 4, cols = 1024;
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--worker")
      f.worker = v;
    else if (k == "--job")
      f.job = v;
    else if (k == "--mode")
      f.mode = v;
    else if (k == "--path")
      f.path = v;
    else if (k == "--algorithm")
      f.algorithm = v;
    else if (k == "--rank")
      f.rank = std::stoi(v);
    else if (k == "--world_size")
      f.world = std::stoi(v);
    else if (k == "--gpu")
      f.gpu = std::stoi(v);
    else if (k == "--global_ranks")
      f.global = std::stoi(v);
    else if (k == "--rows")
      f.rows = std::stoll(v);
    else if (k == "--cols")
      f.cols = std::stoll(v);
    else if (k == "--device_only")
      f.device_only = v == "1" || v == "true";
    else
      return false;
  }
  if (f.global < 0) f.global = f.world;
  return !f.worker.empty() && !f.mode.empty() && !f.path.empty() && f.global % f.world == 0;
}

int32_t Value(int salt, int64_t flat) { return static_cast<int32_t>(flat) ^ (salt * 0x01010101); }

// Host image of a tensor's piece: rows [row0, row0 + n) of a (*, cols) tensor.
std::vector<int32_t> Image(int salt, int64_t row0, int64_t n, int64_t cols) {
  std::vector<int32_t> v(n * cols);
  for (int64_t i = 0; i < n * cols; ++i) v[i] = Value(salt, row0 * cols + i);
  return v;
}

int Run(const Flags& f) {
  if (cudaSetDevice(f.gpu) != cudaSuccess) return Report(absl::FailedPreconditionError("no GPU"));
  ckpt::client::Options options;
  options.worker_address = f.worker;
  options.job = f.job;
  options.rank = f.rank;
  options.world_size = f.world;
  options.local_rank = 0;
  auto client = ckpt::client::Client::Connect(options);
  if (!client.ok()) return Report(client.status());
  auto state = (*client)->NewStateDict();
  const int64_t k = f.global / f.world;
  const int64_t a_bytes = k * f.rows * f.cols * 4, b_bytes = k * f.cols * 4, c_bytes = k * 64 * 4;
  void* block = nullptr;  // one allocation, two tensors (the second at an offset)
  if (cudaMalloc(&block, a_bytes + 4096 + b_bytes) != cudaSuccess) {
    return Report(absl::ResourceExhaustedError("cudaMalloc failed"));
  }
  char* a = static_cast<char*>(block);
  char* b = a + a_bytes + 4096;
  ckpt::client::TensorDeclaration spec_a{
      "dev.a",
      ckpt::DType::kI32,
      {f.global * f.rows, f.cols},
      ckpt::Region{{f.rank * k * f.rows, 0}, {k * f.rows, f.cols}, {}},
      {},
      ckpt::client::MemoryKind::kDevice};
  ckpt::client::TensorDeclaration spec_b{"dev.b",
                                         ckpt::DType::kI32,
                                         {f.global, f.cols},
                                         ckpt::Region{{f.rank * k, 0}, {k, f.cols}, {}},
                                         {},
                                         ckpt::client::MemoryKind::kDevice};
  ckpt::client::TensorDeclaration spec_c{"host.c",
                                         ckpt::DType::kI32,
                                         {f.global, 64},
                                         ckpt::Region{{f.rank * k, 0}, {k, 64}, {}},
                                         {},
                                         ckpt::client::MemoryKind::kHost};
  auto ta = state->AddDevice(spec_a, a, f.gpu);
  if (!ta.ok()) return Report(ta.status());
  auto tb = state->AddDevice(spec_b, b, f.gpu);
  if (!tb.ok()) return Report(tb.status());
  // Mixed state (a host tensor beside the device ones) unless --device_only.
  absl::StatusOr<ckpt::client::StateTensor*> tc = nullptr;
  if (!f.device_only) tc = state->AddHost(spec_c);
  if (!tc.ok()) return Report(tc.status());
  const std::vector<int32_t> want_a = Image(1, f.rank * k * f.rows, k * f.rows, f.cols);
  const std::vector<int32_t> want_b = Image(2, f.rank * k, k, f.cols);
  const std::vector<int32_t> want_c =
      f.device_only ? std::vector<int32_t>() : Image(3, f.rank * k, k, 64);
  if (f.mode == "save") {
    cudaMemcpy(a, want_a.data(), a_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(b, want_b.data(), b_bytes, cudaMemcpyHostToDevice);
    if (*tc != nullptr) std::memcpy((*tc)->data, want_c.data(), c_bytes);
  } else {
    cudaMemset(a, 0, a_bytes);
    cudaMemset(b, 0, b_bytes);
  }
  cudaDeviceSynchronize();
  if (absl::Status s = (*client)->Share(*state); !s.ok()) return Report(s);
  Emit("shared");
  absl::Status result;
  if (f.mode == "save") {
    auto handle = (*client)->Save(f.path, *state);
    result = handle.status();
    if (handle.ok()) {
      const ckpt::client::SnapshotInfo& info = (*handle)->snapshot();
      Emit("snapshotted device_bytes=" + std::to_string(info.device_bytes) +
           " waited_for_writes=" + std::to_string(info.snapshot_waited_for_writes ? 1 : 0) +
           " written_before=" + std::to_string(info.bytes_written_before_snapshot));
      // Training goes on at once: the checkpoint must hold the values at Save.
      cudaMemset(a, 0xff, a_bytes);
      cudaMemset(b, 0xff, b_bytes);
      if (*tc != nullptr) std::memset((*tc)->data, 0xff, c_bytes);
      cudaDeviceSynchronize();
      Emit("mutated");
      result = (*handle)->WaitDurable(absl::Minutes(5));
    }
    return Report(result);
  }
  ckpt::client::LoadOptions load;
  load.exchange_algorithm = f.algorithm;
  result = (*client)->Load(f.path, *state, load);
  if (!result.ok()) return Report(result);
  Report(result);
  std::vector<int32_t> got_a(want_a.size()), got_b(want_b.size()), got_c(want_c.size());
  cudaMemcpy(got_a.data(), a, a_bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_b.data(), b, b_bytes, cudaMemcpyDeviceToHost);
  if (*tc != nullptr) std::memcpy(got_c.data(), (*tc)->data, c_bytes);
  const std::pair<const char*, std::pair<const std::vector<int32_t>*, std::vector<int32_t>*>>
      checks[] = {{"dev.a", {&want_a, &got_a}},
                  {"dev.b", {&want_b, &got_b}},
                  {"host.c", {&want_c, &got_c}}};
  for (const auto& [name, pair] : checks) {
    for (size_t i = 0; i < pair.first->size(); ++i) {
      if ((*pair.first)[i] != (*pair.second)[i]) {
        Emit(std::string("mismatch ") + name + " " + std::to_string(i) + " " +
             std::to_string((*pair.second)[i]) + " " + std::to_string((*pair.first)[i]));
        return 1;
      }
    }
  }
  Emit("verified " + std::to_string(want_a.size() + want_b.size() + want_c.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: device_trainer --worker unix:/p --job J --rank R "
                 "--world_size N --mode save|load --path P\n");
    return 2;
  }
  return Run(flags);
}
