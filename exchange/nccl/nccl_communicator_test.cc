// NCCL backend tests. Without a CUDA device only the "no device" reporting is checked and the
// device tests skip; on a GPU machine they run single-rank (and multi-rank when several GPUs
// are visible) collectives on device memory staged from host.
#include "exchange/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/gpu.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

bool HaveGpu() { return CudaDeviceCount().ok(); }

#define SKIP_WITHOUT_GPU()                                                              \
  if (!HaveGpu()) {                                                                     \
    GTEST_SKIP() << "requires a CUDA device: " << CudaDeviceCount().status().message(); \
  }

TEST(NcclNoDeviceTest, CreateReportsNoCudaDeviceAsFailedPrecondition) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present; the no-device path cannot be seen";
  InMemoryStore store;
  auto comm = CreateNcclCommunicator(&store, 0, 1, NcclOptions(), absl::Now() + absl::Seconds(5));
  ASSERT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_EQ(comm.status().message().rfind("no CUDA device: ", 0), 0u) << comm.status();
}

// Device buffer holding a host string.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, n_), cudaSuccess);
    }
  }
  explicit DeviceBuffer(const std::string& s) : DeviceBuffer(s.size()) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, s.data(), n_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  char* get() { return static_cast<char*>(ptr_); }
  std::string ToHost() const {
    std::string s(n_, '\0');
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(s.data(), ptr_, n_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return s;
  }

 private:
  size_t n_;
  void* ptr_ = nullptr;
};

std::string Payload(int seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 37 + i * 11) & 0xff);
  return s;
}

TEST(NcclDeviceTest, SingleRankCollectivesOnDeviceMemory) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto comm = CreateNcclCommunicator(&store, 0, 1, NcclOptions(), deadline);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_EQ(c.memory_kind(), MemoryKind::kDevice);

  DeviceBuffer b(Payload(1, 4099));
  ASSERT_TRUE(c.Broadcast(b.get(), 4099, 0, deadline).ok());
  EXPECT_EQ(b.ToHost(), Payload(1, 4099));

  DeviceBuffer out(4099);
  std::vector<size_t> counts = {4099};
  ASSERT_TRUE(c.AllGatherV(b.get(), counts, out.get(), deadline).ok());
  EXPECT_EQ(out.ToHost(), Payload(1, 4099));

  DeviceBuffer g(4099);
  ASSERT_TRUE(c.GatherV(b.get(), 4099, counts, g.get(), 0, deadline).ok());
  EXPECT_EQ(g.ToHost(), Payload(1, 4099));
  DeviceBuffer sc(4099);
  ASSERT_TRUE(c.ScatterV(g.get(), counts, sc.get(), 4099, 0, deadline).ok());
  EXPECT_EQ(sc.ToHost(), Payload(1, 4099));

  DeviceBuffer a(4099);
  ASSERT_TRUE(c.AllToAllV(b.get(), counts, a.get(), counts, deadline).ok());
  EXPECT_EQ(a.ToHost(), Payload(1, 4099));

  std::vector<std::vector<ByteSlice>> send = {{{100, 10}, {0, 5}}};
  std::vector<std::vector<ByteSlice>> recv = {{{0, 3}, {50, 12}}};
  DeviceBuffer ia(std::string(100, '.'));
  ASSERT_TRUE(c.IndexedAllToAllV(b.get(), send, ia.get(), recv, deadline).ok());
  std::string src = Payload(1, 4099);
  std::string stream = src.substr(100, 10) + src.substr(0, 5);
  std::string expected(100, '.');
  expected.replace(0, 3, stream.substr(0, 3));
  expected.replace(50, 12, stream.substr(3));
  EXPECT_EQ(ia.ToHost(), expected);

  EXPECT_TRUE(c.Barrier(deadline).ok());
  EXPECT_EQ(c.Broadcast(b.get(), 1, 3, deadline).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclDeviceTest, AllGatherVAcrossEveryVisibleGpu) {
  SKIP_WITHOUT_GPU();
  int n = *CudaDeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2+ GPUs for a multi-rank NCCL group; found " << n;
  InMemoryStore store;
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<std::string> results(n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  std::vector<size_t> counts;
  std::string expected;
  for (int r = 0; r < n; ++r) {
    counts.push_back(r * 1001 + 3);
    expected += Payload(r, r * 1001 + 3);
  }
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.cuda_device = r;
      cudaSetDevice(r);
      auto comm = CreateNcclCommunicator(&store, r, n, options, deadline);
      if (!comm.ok()) {
        statuses[r] = comm.status();
        return;
      }
      DeviceBuffer mine(Payload(r, counts[r]));
      DeviceBuffer out(expected.size());
      statuses[r] = (*comm)->AllGatherV(mine.get(), counts, out.get(), deadline);
      results[r] = out.ToHost();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(results[r], expected) << "rank " << r;
  }
}

}  // namespace
}  // namespace ckpt
