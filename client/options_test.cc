#include "client/options.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(OptionsTest, TorchrunEnvironment) {
  auto r = ResolveOptions({}, Env({{"RANK", "3"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"TORCHELASTIC_RUN_ID", "run7"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->job, "run7");
  EXPECT_EQ(r->launcher, "torchrun");
  EXPECT_EQ(r->worker_address, DefaultWorkerAddress(1));
}

TEST(OptionsTest, SlurmEnvironment) {
  auto r = ResolveOptions({}, Env({{"SLURM_PROCID", "5"},
                                   {"SLURM_NPROCS", "6"},
                                   {"SLURM_LOCALID", "2"},
                                   {"SLURM_JOB_ID", "991"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 6);
  EXPECT_EQ(r->local_rank, 2);
  EXPECT_EQ(r->job, "991");
  EXPECT_EQ(r->launcher, "slurm");
}

TEST(OptionsTest, OpenMpiEnvironment) {
  auto r = ResolveOptions({}, Env({{"OMPI_COMM_WORLD_RANK", "0"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                   {"CKPT_JOB", "j"},
                                   {"CKPT_WORKER_ADDRESS", "unix:/x.sock"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->launcher, "openmpi");
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->worker_address, "unix:/x.sock");
}

TEST(OptionsTest, TorchrunWinsOverSlurmWhenBothAreSet) {
  auto r = ResolveOptions({}, Env({{"RANK", "1"},
                                   {"WORLD_SIZE", "2"},
                                   {"SLURM_PROCID", "7"},
                                   {"SLURM_NPROCS", "16"},
                                   {"CKPT_JOB", "j"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->local_rank, 0);
}

TEST(OptionsTest, ExplicitOptionsTakePrecedence) {
  Options o;
  o.job = "mine";
  o.rank = 2;
  o.world_size = 4;
  o.local_rank = 0;
  o.worker_address = "unix:/w.sock";
  auto r = ResolveOptions(o, Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"CKPT_JOB", "env"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job, "mine");
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->worker_address, "unix:/w.sock");
  EXPECT_EQ(r->launcher, "explicit");
}

TEST(OptionsTest, MissingValuesAreNamedWithTheirVariables) {
  auto r = ResolveOptions({}, Env({}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("rank (pass Options::rank or set RANK, SLURM_PROCID, "
                                              "OMPI_COMM_WORLD_RANK)"));
  EXPECT_THAT(r.status().message(), HasSubstr("world_size"));
  EXPECT_THAT(r.status().message(), HasSubstr("job (pass Options::job or set CKPT_JOB"));
}

TEST(OptionsTest, LauncherMissingWorldSizeIsNamed) {
  auto r = ResolveOptions({}, Env({{"SLURM_PROCID", "0"}, {"CKPT_JOB", "j"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("slurm sets rank through SLURM_PROCID but not "
                                              "SLURM_NPROCS"));
}

TEST(OptionsTest, MalformedOrInconsistentValuesAreRejected) {
  EXPECT_THAT(ResolveOptions({}, Env({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"CKPT_JOB", "j"}}))
                  .status()
                  .message(),
              HasSubstr("RANK=\"x\" is not an integer"));
  EXPECT_THAT(ResolveOptions({}, Env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"CKPT_JOB", "j"}}))
                  .status()
                  .message(),
              HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_FALSE(
      ResolveOptions({}, Env({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"CKPT_JOB", "j"}})).ok());
}

}  // namespace
}  // namespace ckpt::client
