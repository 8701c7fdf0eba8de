#include "exchange/communicator_factory.h"

#include "absl/time/clock.h"
#include "device/gpu.h"
#include "exchange/nccl/nccl_communicator.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(CommunicatorFactoryTest, HostMemoryGetsGloo) {
  InMemoryStore store;
  CommunicatorOptions options;
  options.memory_kind = MemoryKind::kHost;
  auto comm = CreateCommunicator(&store, 0, 1, options, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend_name(), "gloo");
  EXPECT_EQ((*comm)->memory_kind(), MemoryKind::kHost);
}

TEST(CommunicatorFactoryTest, DeviceMemoryGetsNcclOrAClearNoDeviceError) {
  InMemoryStore store;
  CommunicatorOptions options;
  options.memory_kind = MemoryKind::kDevice;
  auto comm = CreateCommunicator(&store, 0, 1, options, absl::Now() + absl::Seconds(30));
  if (CudaDeviceCount().ok()) {
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->backend_name(), "nccl");
  } else {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(comm.status().message().find("no CUDA device"), std::string::npos) << comm.status();
  }
}

}  // namespace
}  // namespace ckpt
