#include "common/launcher_env.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LauncherEnvTest, LocalRankAloneForTheWorker) {
  EXPECT_EQ(*ResolveLocalRank(std::nullopt, Env({})), 0);
  EXPECT_EQ(*ResolveLocalRank(std::nullopt, Env({{"SLURM_LOCALID", "3"}})), 3);
  EXPECT_EQ(*ResolveLocalRank(std::nullopt, Env({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}})), 2);
  EXPECT_EQ(*ResolveLocalRank(5, Env({{"LOCAL_RANK", "3"}})), 5);
  EXPECT_FALSE(ResolveLocalRank(std::nullopt, Env({{"LOCAL_RANK", "a"}})).ok());
}

TEST(LauncherEnvTest, TheFirstLauncherWhoseRankIsSetIsDetected) {
  EXPECT_EQ(DetectLauncher(Env({})), nullptr);
  EXPECT_STREQ(DetectLauncher(Env({{"SLURM_PROCID", "1"}}))->name, "slurm");
  EXPECT_STREQ(DetectLauncher(Env({{"SLURM_PROCID", "1"}, {"RANK", "0"}}))->name, "torchrun");
  EXPECT_STREQ(DetectLauncher(Env({{"OMPI_COMM_WORLD_RANK", "0"}}))->name, "openmpi");
}

TEST(LauncherEnvTest, MalformedIntegerNamesTheVariableAndValue) {
  absl::StatusOr<std::optional<int>> v = ReadIntVariable(Env({{"RANK", "x1"}}), "RANK");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("RANK=\"x1\""), std::string::npos) << v.status();
  EXPECT_FALSE(ReadIntVariable(Env({}), "RANK")->has_value());
}

TEST(LauncherEnvTest, JobComesFromTheFirstNonEmptyVariable) {
  EXPECT_FALSE(JobFromEnvironment(Env({})).has_value());
  EXPECT_EQ(*JobFromEnvironment(Env({{"CKPT_JOB", ""}, {"SLURM_JOB_ID", "77"}})), "77");
  EXPECT_EQ(*JobFromEnvironment(Env({{"CKPT_JOB", "a"}, {"TORCHELASTIC_RUN_ID", "b"}})), "a");
}

TEST(LauncherEnvTest, DefaultWorkerAddressNamesTheLocalRank) {
  std::string address = DefaultWorkerAddress(3);
  EXPECT_EQ(address.rfind("unix:/tmp/ckpt-worker-", 0), 0u) << address;
  EXPECT_NE(address.find("-3.sock"), std::string::npos) << address;
}

}  // namespace
}  // namespace ckpt
