// The exchange algorithms over NCCL through host staging. Needs a CUDA device (skips without
// one); with one GPU it runs N=1 (a multi-rank group needs one GPU per rank).
#include <string>

#include "absl/time/clock.h"
#include "device/gpu.h"
#include "exchange/exchange.h"
#include "exchange/exchange_testing.h"
#include "exchange/nccl/host_staging_communicator.h"
#include "exchange/nccl/nccl_communicator.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(NcclExchangeTest, AllAlgorithmsOnOneGpuMatchTheReference) {
  if (!CudaDeviceCount().ok()) {
    GTEST_SKIP() << "requires a CUDA device: " << CudaDeviceCount().status().message();
  }
  for (const std::string& algorithm : ExchangeAlgorithmNames()) {
    for (bool reshard : {false, true}) {
      if (reshard && algorithm != "overlap_all_to_all") continue;
      InMemoryStore store;
      NcclOptions options;
      options.group_name = algorithm;
      auto nccl = CreateNcclCommunicator(&store, 0, 1, options, absl::Now() + absl::Seconds(60));
      ASSERT_TRUE(nccl.ok()) << nccl.status();
      HostStagingCommunicator comm(std::move(*nccl));
      ScenarioOptions so;
      so.num_ranks = 1;
      so.scale = 5;
      so.reshard = reshard;
      Scenario sc = MakeScenario(so);
      ExchangeOptions eo;
      eo.memory_budget_bytes = 301;
      eo.deadline = absl::Now() + absl::Seconds(60);
      auto out = ExchangeByDistribution(algorithm, comm, sc.plan, sc.loaded[0], eo);
      ASSERT_TRUE(out.ok()) << algorithm << ": " << out.status();
      EXPECT_TRUE(*out == ReferenceOutputs(sc.plan, 0)) << algorithm;
    }
  }
}

TEST(NcclExchangeTest, StagedCollectivesRoundTripHostBytes) {
  if (!CudaDeviceCount().ok()) {
    GTEST_SKIP() << "requires a CUDA device: " << CudaDeviceCount().status().message();
  }
  InMemoryStore store;
  auto nccl = CreateNcclCommunicator(&store, 0, 1, NcclOptions(), absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  HostStagingCommunicator comm(std::move(*nccl));
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string data = "odd-sized payload!";
  std::vector<size_t> counts = {data.size()};
  std::string out(data.size(), '?');
  ASSERT_TRUE(comm.AllGatherV(data.data(), counts, out.data(), deadline).ok());
  EXPECT_EQ(out, data);
  std::vector<std::vector<ByteSlice>> send = {{{4, 5}, {0, 3}}};
  std::vector<std::vector<ByteSlice>> recv = {{{10, 8}}};
  std::string target(20, '.');
  ASSERT_TRUE(comm.IndexedAllToAllV(data.data(), send, target.data(), recv, deadline).ok());
  EXPECT_EQ(target, std::string("..........") + data.substr(4, 5) + data.substr(0, 3) + "..");
}

}  // namespace
}  // namespace ckpt
