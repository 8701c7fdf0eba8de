// `ckptctl certs issue` trusts its CA key only as far as the daemons trust theirs: a key that
// other users may read is refused (the daemons' own check, common/transport_security), and a
// key that does not match the CA certificate is refused before it signs anything.
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

TEST(CkptctlCertsTest, IssueRefusesACaKeyThatDoesNotMatchTheCaCertificateNamingIt) {
  Cluster cluster;  // for its scratch directory and RunCkptctl
  const std::string dir = cluster.dir() + "/ca";
  const std::string other = cluster.dir() + "/other-ca";
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"certs", "init", "--dir", dir}, &out), 0) << out;
  ASSERT_EQ(cluster.RunCkptctl({"certs", "init", "--dir", other}, &out), 0) << out;
  std::filesystem::copy_file(other + "/ca.key", dir + "/ca.key",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(chmod((dir + "/ca.key").c_str(), 0600), 0);
  EXPECT_EQ(
      cluster.RunCkptctl({"certs", "issue", "--dir", dir, "--role", "worker", "--name", "h"}, &out),
      1)
      << out;
  EXPECT_THAT(out, HasSubstr("the CA private key " + dir +
                             "/ca.key does not match the CA "
                             "certificate " +
                             dir + "/ca.pem"));
  EXPECT_FALSE(Exists(dir + "/worker-h.pem"));
  EXPECT_FALSE(Exists(dir + "/worker-h.key"));
  // The other CA, whose key that is, issues with it.
  ASSERT_EQ(cluster.RunCkptctl(
                {"certs", "issue", "--dir", other, "--role", "worker", "--name", "h"}, &out),
            0)
      << out;
  EXPECT_TRUE(Exists(other + "/worker-h.pem"));
}

TEST(CkptctlCertsTest, IssueRefusesACaKeyOtherUsersMayReadAsTheDaemonsDo) {
  Cluster cluster;
  const std::string dir = cluster.dir() + "/ca";
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"certs", "init", "--dir", dir}, &out), 0) << out;
  for (mode_t mode : {0644, 0640, 0604}) {
    ASSERT_EQ(chmod((dir + "/ca.key").c_str(), mode), 0);
    EXPECT_EQ(cluster.RunCkptctl(
                  {"certs", "issue", "--dir", dir, "--role", "operator", "--name", "ops"}, &out),
              1)
        << mode << " " << out;
    EXPECT_THAT(out, HasSubstr("the private key " + dir + "/ca.key is readable by other users"))
        << mode;
    EXPECT_FALSE(Exists(dir + "/operator-ops.pem"));
  }
  ASSERT_EQ(chmod((dir + "/ca.key").c_str(), 0600), 0);
  EXPECT_EQ(cluster.RunCkptctl(
                {"certs", "issue", "--dir", dir, "--role", "operator", "--name", "ops"}, &out),
            0)
      << out;
  EXPECT_TRUE(Exists(dir + "/operator-ops.pem"));
}

}  // namespace
}  // namespace ckpt::testing
