#include "worker/load_communicator.h"

#include <string>

#include "device/gpu.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

pb::LoadPlanPart Part(bool device_exchange) {
  pb::LoadPlanPart part;
  part.set_rank(0);
  part.set_world_size(1);
  part.set_group("load/op-test");
  part.set_device_exchange(device_exchange);
  part.set_transport_reason(device_exchange ? "every rank is device-resident" : "rank 0 is not");
  return part;
}

LoadCommunicatorConfig Config(int cuda_device) {
  LoadCommunicatorConfig config;
  config.cuda_device = cuda_device;
  config.rendezvous_address = "coordinator:1";
  config.rendezvous_timeout = absl::Seconds(10);
  return config;
}

TEST(LoadCommunicatorOptionsTest, AHostPartAsksForGlooEvenOnAWorkerWithAGpu) {
  auto options = LoadCommunicatorOptions(Part(false), Config(0), "rank 0 of job j");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->memory_kind, MemoryKind::kHost);
  EXPECT_EQ(options->group_name, "load/op-test");
}

TEST(LoadCommunicatorOptionsTest, ADevicePartAsksForNcclOnTheWorkersGpu) {
  auto options = LoadCommunicatorOptions(Part(true), Config(3), "rank 0 of job j");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->memory_kind, MemoryKind::kDevice);
  EXPECT_EQ(options->cuda_device, 3);
  EXPECT_EQ(options->group_name, "load/op-test");
}

TEST(LoadCommunicatorOptionsTest, ADevicePartOnAWorkerWithoutAGpuIsRefusedSayingWhy) {
  auto options = LoadCommunicatorOptions(Part(true), Config(-1), "rank 0 of job j");
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(options.status().message(),
              HasSubstr("rank 0 of job j: the plan asks for the device exchange over NCCL "
                        "(every rank is device-resident) but this worker serves no GPU"));
}

TEST(JoinLoadCommunicatorTest, AHostPartJoinsAGlooGroupThroughTheStore) {
  InMemoryStore store;
  auto comm = JoinLoadCommunicator(Part(false), Config(-1), &store, "rank 0 of job j");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend_name(), "gloo");
  EXPECT_EQ((*comm)->memory_kind(), MemoryKind::kHost);
  char byte = 7;
  EXPECT_TRUE((*comm)->Broadcast(&byte, 1, 0, absl::Now() + absl::Seconds(10)).ok());
}

TEST(JoinLoadCommunicatorTest, ADevicePartWithoutCudaReachesNcclAndNamesRankGroupAndTransport) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present: tests/device_e2e_test covers it";
  InMemoryStore store;
  auto comm = JoinLoadCommunicator(Part(true), Config(0), &store, "rank 0 of job j");
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_THAT(comm.status().message(),
              HasSubstr("rank 0 of job j: joining the load's communicator (nccl (device), group "
                        "load/op-test, 1 ranks, rendezvous at coordinator:1): no CUDA device"));
}

}  // namespace
}  // namespace ckpt::worker
