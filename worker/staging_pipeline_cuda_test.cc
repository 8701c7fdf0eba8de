// requires-gpu: the staging pipeline over the production CudaCopyEngine on real device memory.
// Skips, saying why, without a GPU. NOT YET RUN: written on a machine without one.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "device/cuda_copy_engine.h"
#include "device/gpu.h"
#include "gtest/gtest.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {
namespace {

#define SKIP_WITHOUT_GPU()                                                              \
  if (!CudaDeviceCount().ok()) {                                                        \
    GTEST_SKIP() << "requires a CUDA device: " << CudaDeviceCount().status().message(); \
  }

constexpr int64_t kChunk = int64_t{8} << 20;

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7 + i / 4093) & 0xff);
  return v;
}

class CudaStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    auto engine = CudaCopyEngine::Create(0);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    pool_ = std::make_unique<PinnedStagingPool>(engine_.get(), 4 * kChunk, kChunk);
  }
  void TearDown() override {
    for (void* p : device_) cudaFree(p);
  }
  void* Device(const std::vector<char>& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    device_.push_back(p);
    return p;
  }
  std::unique_ptr<CudaCopyEngine> engine_;
  std::unique_ptr<PinnedStagingPool> pool_;
  std::vector<void*> device_;
};

TEST_F(CudaStagingTest, StagesDeviceTensorsLargerThanThePoolByteExact) {
  const std::vector<char> a = Pattern(9 * kChunk + 123, 1), b = Pattern(5, 2);
  std::vector<DeviceRange> ranges = {{"a", Device(a), static_cast<int64_t>(a.size())},
                                     {"b", Device(b), static_cast<int64_t>(b.size())}};
  std::vector<std::vector<char>> staged = {std::vector<char>(a.size()), std::vector<char>(5)};
  auto lease = pool_->Acquire(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  StagingStats stats;
  absl::Status s = StageDeviceToHost(
      *lease, ranges, "rank 0 of job gpu", nullptr,
      [&](const StagedChunk& c) {
        std::memcpy(staged[c.range].data() + c.offset, c.host, c.bytes);
        return absl::OkStatus();
      },
      nullptr, absl::Now() + absl::Seconds(60), &stats);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(stats.over_budget);
  EXPECT_EQ(staged[0], a);
  EXPECT_EQ(staged[1], b);
}

TEST_F(CudaStagingTest, OverwritingTheDeviceTensorAtTheDrainedSignalDoesNotReachTheSnapshot) {
  const std::vector<char> a = Pattern(3 * kChunk, 3);  // fits: drained before any consume
  void* dev = Device(a);
  std::vector<DeviceRange> ranges = {{"a", dev, static_cast<int64_t>(a.size())}};
  std::vector<char> staged(a.size());
  auto lease = pool_->Acquire(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(lease.ok());
  absl::Status s = StageDeviceToHost(
      *lease, ranges, "rank 0 of job gpu", nullptr,
      [&](const StagedChunk& c) {
        std::memcpy(staged.data() + c.offset, c.host, c.bytes);
        return absl::OkStatus();
      },
      [&] {
        // The trainer trains on: its tensor changes at once.
        ASSERT_EQ(cudaMemset(dev, 0xff, a.size()), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      },
      absl::Now() + absl::Seconds(60), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(staged, a);
}

TEST_F(CudaStagingTest, HostToDeviceFillsTheDeviceTensorByteExact) {
  const std::vector<char> a = Pattern(7 * kChunk + 9, 4);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, a.size()), cudaSuccess);
  device_.push_back(dev);
  std::vector<DeviceRange> ranges = {{"a", dev, static_cast<int64_t>(a.size())}};
  auto lease = pool_->Acquire(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(lease.ok());
  absl::Status s = StageHostToDevice(
      *lease, ranges, CutIntoChunks(ranges, kChunk), "rank 0 of job gpu", nullptr,
      [&](const StagedChunk& c) {
        std::memcpy(c.host, a.data() + c.offset, c.bytes);
        return absl::OkStatus();
      },
      absl::Now() + absl::Seconds(60), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<char> back(a.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dev, a.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, a);
}

TEST_F(CudaStagingTest, ExportFindsTheAllocationAndTheOffsetOfASubAllocatedTensor) {
  const std::vector<char> a = Pattern(1 << 20, 5);
  char* base = static_cast<char*>(Device(a));
  auto exported = ExportDeviceAllocation(base + 4096);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->offset, 4096);
  EXPECT_GE(exported->allocation_bytes, 1 << 20);
  EXPECT_EQ(exported->ipc_handle.size(), kCudaIpcHandleBytes);
  EXPECT_EQ(exported->device, 0);
}

TEST_F(CudaStagingTest, ExportRefusesPoolAllocationsSayingWhy) {
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 1 << 20, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  auto exported = ExportDeviceAllocation(p);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kFailedPrecondition) << exported.status();
  EXPECT_NE(exported.status().message().find("cannot be exported with cudaIpcGetMemHandle"),
            std::string::npos)
      << exported.status();
  cudaFreeAsync(p, nullptr);
  cudaStreamSynchronize(nullptr);
}

}  // namespace
}  // namespace ckpt::worker
