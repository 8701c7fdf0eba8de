// The Communicator conformance suite (exchange/communicator_conformance.h) over NCCL on device
// memory, and over NCCL behind the host-staging adapter on host memory. Needs a CUDA device
// (every case skips without one, saying so); with one GPU it runs N=1 (a multi-rank NCCL group
// needs one GPU per rank).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "device/gpu.h"
#include "exchange/communicator_conformance.h"
#include "exchange/nccl/host_staging_communicator.h"
#include "exchange/nccl/nccl_communicator.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// Buffers in the calling thread's current CUDA device's memory.
class DeviceMemory : public ConformanceMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* data = nullptr;
    absl::Status s = CudaStatus(cudaMalloc(&data, bytes > 0 ? bytes : 1), "cudaMalloc");
    if (!s.ok()) return s;
    return data;
  }
  void Free(void* buffer) override { cudaFree(buffer); }
  absl::Status CopyIn(void* buffer, const std::string& host) override {
    if (host.empty()) return absl::OkStatus();
    return CudaStatus(cudaMemcpy(buffer, host.data(), host.size(), cudaMemcpyHostToDevice),
                      "cudaMemcpy to device");
  }
  absl::StatusOr<std::string> CopyOut(const void* buffer, size_t bytes) override {
    std::string host(bytes, '\0');
    if (bytes == 0) return host;
    absl::Status s =
        CudaStatus(cudaMemcpy(host.data(), buffer, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (!s.ok()) return s;
    return host;
  }
};

std::string NoGpuReason() {
  auto count = CudaDeviceCount();
  return count.ok() ? std::string()
                    : absl::StrCat("requires a CUDA device: ", count.status().message());
}

// NCCL with rank r on GPU r (set current on the rank's thread, which also allocates its buffers).
CommunicatorMaker NcclMaker(const std::string& group_name, bool host_staging) {
  return [group_name, host_staging](
             Store* store, int rank, int size,
             absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    cudaSetDevice(rank);
    NcclOptions options;
    options.group_name = group_name;
    options.cuda_device = rank;
    auto comm = CreateNcclCommunicator(store, rank, size, options, deadline);
    if (!comm.ok() || !host_staging) return comm;
    return std::unique_ptr<Communicator>(new HostStagingCommunicator(std::move(*comm)));
  };
}

ConformanceBackend NcclBackend(bool host_staging) {
  ConformanceBackend backend;
  backend.name = host_staging ? "nccl_host_staging" : "nccl";
  backend.maker = [host_staging](const std::string& group) {
    return NcclMaker(group, host_staging);
  };
  backend.memory = host_staging ? HostConformanceMemory() : std::make_shared<DeviceMemory>();
  backend.names_stalled_peer = false;
  backend.unavailable_reason = NoGpuReason;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(NcclBackend(false), {1})),
                         ConformanceCaseName);
INSTANTIATE_TEST_SUITE_P(NcclHostStaging, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(NcclBackend(true), {1})),
                         ConformanceCaseName);

}  // namespace
}  // namespace ckpt
