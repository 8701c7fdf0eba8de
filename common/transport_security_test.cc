#include "common/transport_security.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

TEST(TransportSecurityTest, LoopbackAddressesAreTheOnlyOnesLeftPlaintext) {
  for (const char* address : {"127.0.0.1:7400", "127.3.4.5:1", "localhost:7400", "[::1]:7400",
                              "ipv4:127.0.0.1:5", "unix:/tmp/ckpt.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:7400", "[::]:7400", "10.0.0.7:7400", "node7:7400", ":7400",
                              "128.0.0.1:1", "[::ffff:10.0.0.1]:7400"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(TransportSecurityTest, RolesRoundTripThroughTheirUris) {
  for (Role role : {Role::kWorker, Role::kOperator, Role::kCoordinator}) {
    EXPECT_EQ(RoleFromUri(RoleUri(role)), role);
  }
  EXPECT_EQ(RoleUri(Role::kWorker), "ckpt://role/worker");
  EXPECT_FALSE(RoleFromUri("ckpt://role/admin").has_value());
  EXPECT_FALSE(RoleFromUri("spiffe://role/worker").has_value());
}

TEST(TransportSecurityTest, BeyondLoopbackWithoutCertificatesIsRefusedSayingHowToMakeThem) {
  auto s = ResolveTransportSecurity({}, /*insecure=*/false, "0.0.0.0:7400", "--listen",
                                    "ckpt_coordinator");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("ckptctl certs init"));
  EXPECT_THAT(s.status().message(), HasSubstr("--insecure"));
}

TEST(TransportSecurityTest, InsecureIsAllowedBeyondLoopbackButMarked) {
  auto s = ResolveTransportSecurity({}, /*insecure=*/true, "0.0.0.0:7400", "--listen", "x");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->tls);
  EXPECT_TRUE(s->insecure_beyond_loopback);
  auto loopback = ResolveTransportSecurity({}, false, "127.0.0.1:0", "--listen", "x");
  ASSERT_TRUE(loopback.ok());
  EXPECT_FALSE(loopback->tls);
  EXPECT_FALSE(loopback->insecure_beyond_loopback);
}

TEST(TransportSecurityTest, CertificateFilesGoTogetherAndKeysMustBePrivate) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
  std::ofstream(dir + "/ca.pem") << pem;
  std::ofstream(dir + "/c.pem") << pem;
  std::ofstream(dir + "/c.key") << pem;
  chmod((dir + "/c.key").c_str(), 0644);
  auto partial = ResolveTransportSecurity({dir + "/ca.pem", "", ""}, false, "h:1", "--x", "p");
  EXPECT_THAT(partial.status().message(), HasSubstr("go together"));
  TlsFiles files{dir + "/ca.pem", dir + "/c.pem", dir + "/c.key"};
  auto loose = ResolveTransportSecurity(files, false, "h:1", "--x", "p");
  EXPECT_THAT(loose.status().message(), HasSubstr("chmod 600 " + dir + "/c.key"));
  chmod((dir + "/c.key").c_str(), 0600);
  auto tls = ResolveTransportSecurity(files, false, "h:1", "--x", "p");
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->tls);
  EXPECT_EQ(tls->key_pem, pem);
  auto missing = ResolveTransportSecurity({dir + "/nope.pem", files.cert, files.key}, false, "h:1",
                                          "--x", "p");
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope.pem"));
}

}  // namespace
}  // namespace ckpt
