// ckptctl save, load and reshard with --coordinator and an s3:// checkpoint (issue 43): the URL
// reaches the coordinator exactly as given, never made absolute against ckptctl's working
// directory ("/cwd/s3:/bucket/..."). The coordinator's only root here is a directory, so it
// refuses the URL, naming it as the operator wrote it (saving to S3 itself is s3_cluster_test's).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_util.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

TEST(CkptctlUrlTest, SaveLoadAndReshardSendAnS3UrlToTheCoordinatorAsGiven) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=5000"}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  const std::string url = "s3://bucket/ckpts/step1";
  const std::string layout = cluster.dir() + "/tp1.json";
  ASSERT_TRUE(WriteFileAtomically(layout,
                                  "{\"world_size\": 1, \"mesh\": {\"tp\": 1}, \"rules\": "
                                  "[{\"match\": \"*\", \"placements\": [\"Replicate()\"]}]}")
                  .ok());
  const std::vector<std::vector<std::string>> commands = {
      {"save", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "30s", url},
      {"load", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "30s", url},
      {"save", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "30s",
       "mem://step1", "--persist-to", url},
      {"reshard", url, cluster.dir() + "/resharded", "--layout", layout, "--coordinator",
       cluster.address(), "--timeout", "30s"}};
  for (const std::vector<std::string>& command : commands) {
    std::string out;
    EXPECT_NE(cluster.RunCkptctl(command, &out), 0) << command[0];
    EXPECT_THAT(out, HasSubstr("'" + url + "'")) << command[0];
    EXPECT_THAT(out, HasSubstr("outside the checkpoint roots")) << command[0];
  }
}

}  // namespace
}  // namespace ckpt::testing
