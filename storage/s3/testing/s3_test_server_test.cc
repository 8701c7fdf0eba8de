// S3TestServer against libcurl's own SigV4 signing (CURLOPT_AWS_SIGV4): a real Swift answers
// signed S3 requests, refuses a wrong secret, survives a proxy kill with its data, and answers
// 503 while its object server is killed, until it is restarted.
#include "storage/s3/testing/s3_test_server.h"

#include <curl/curl.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// One HTTP exchange's outcome.
struct Reply {
  CURLcode code = CURLE_OK;
  long http = 0;  // NOLINT(runtime/int): libcurl's type
  std::string body;
};

size_t Collect(char* data, size_t size, size_t n, void* sink) {
  static_cast<std::string*>(sink)->append(data, size * n);
  return size * n;
}

// A SigV4-signed request (path-style: endpoint/bucket/key). `body` is PUT when not null;
// `range` is an HTTP Range ("10-19") when not empty.
Reply Send(const S3TestServer& server, const std::string& method, const std::string& path,
           const std::string& secret, const std::string* body = nullptr,
           const std::string& range = "") {
  Reply reply;
  CURL* curl = curl_easy_init();
  const std::string url = server.endpoint() + path;
  const std::string sigv4 = absl::StrCat("aws:amz:", server.region(), ":s3");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  // Tempauth's access key ids hold a colon ("account:user"): never CURLOPT_USERPWD.
  curl_easy_setopt(curl, CURLOPT_USERNAME, server.access_key_id().c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, secret.c_str());
  // s3api requires this header; curl 7.88 signs it as given.
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
  }
  if (!range.empty()) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 30000L);
  reply.code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.http);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return reply;
}

std::unique_ptr<S3TestServer> StartOrFail() {
  absl::StatusOr<std::unique_ptr<S3TestServer>> server = S3TestServer::Start();
  EXPECT_TRUE(server.ok()) << server.status()
                           << "\n(Swift with s3api comes from tools/install_deps.sh)";
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(S3TestServerTest, SignedPutThenRangedGetReturnsThoseBytes) {
  std::unique_ptr<S3TestServer> server = StartOrFail();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->region(), "us-east-1");
  const std::string secret = server->secret_access_key();
  Reply bucket = Send(*server, "PUT", "/ckpt-bucket", secret);
  ASSERT_EQ(bucket.code, CURLE_OK) << curl_easy_strerror(bucket.code);
  ASSERT_EQ(bucket.http, 200) << bucket.body;
  const std::string data = "0123456789abcdefghijklmnopqrstuvwxyz";
  Reply put = Send(*server, "PUT", "/ckpt-bucket/dir/piece", secret, &data);
  ASSERT_EQ(put.http, 200) << put.body;
  Reply get = Send(*server, "GET", "/ckpt-bucket/dir/piece", secret, nullptr, "10-19");
  EXPECT_EQ(get.http, 206) << get.body;
  EXPECT_EQ(get.body, "abcdefghij");
}

TEST(S3TestServerTest, WrongSecretIsRefusedWith403) {
  std::unique_ptr<S3TestServer> server = StartOrFail();
  ASSERT_NE(server, nullptr);
  Reply good = Send(*server, "PUT", "/ckpt-bucket", server->secret_access_key());
  ASSERT_EQ(good.http, 200) << good.body;
  Reply bad = Send(*server, "GET", "/ckpt-bucket", server->secret_access_key() + "x");
  EXPECT_EQ(bad.http, 403) << bad.body;
  EXPECT_NE(bad.body.find("SignatureDoesNotMatch"), std::string::npos) << bad.body;
}

TEST(S3TestServerTest, KilledProxyRefusesConnectionsAndRestartedProxyHasTheData) {
  std::unique_ptr<S3TestServer> server = StartOrFail();
  ASSERT_NE(server, nullptr);
  const std::string secret = server->secret_access_key();
  ASSERT_EQ(Send(*server, "PUT", "/ckpt-bucket", secret).http, 200);
  const std::string data = "kept across a proxy restart";
  ASSERT_EQ(Send(*server, "PUT", "/ckpt-bucket/obj", secret, &data).http, 200);

  ASSERT_TRUE(server->KillProxy().ok());
  Reply down = Send(*server, "GET", "/ckpt-bucket/obj", secret);
  EXPECT_EQ(down.code, CURLE_COULDNT_CONNECT) << curl_easy_strerror(down.code);

  const std::string endpoint = server->endpoint();
  absl::Status restarted = server->RestartProxy();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_EQ(server->endpoint(), endpoint);
  Reply up = Send(*server, "GET", "/ckpt-bucket/obj", secret);
  EXPECT_EQ(up.http, 200) << up.body;
  EXPECT_EQ(up.body, data);
}

TEST(S3TestServerTest, KilledObjectServerIs503AndRestartedOneServesTheObjectAtOnce) {
  std::unique_ptr<S3TestServer> server = StartOrFail();
  ASSERT_NE(server, nullptr);
  const std::string secret = server->secret_access_key();
  ASSERT_EQ(Send(*server, "PUT", "/ckpt-bucket", secret).http, 200);
  const std::string data = "kept across an object server restart";
  ASSERT_EQ(Send(*server, "PUT", "/ckpt-bucket/obj", secret, &data).http, 200);
  EXPECT_FALSE(server->RestartServer("object").ok()) << "restarted a running object server";

  ASSERT_TRUE(server->KillServer("object").ok());
  // More failures than Swift's default error_suppression_limit (10), which would keep the
  // proxy off the object server for 60 s after it is back.
  for (int i = 0; i < 12; ++i) {
    Reply down = Send(*server, "GET", "/ckpt-bucket/obj", secret);
    ASSERT_EQ(down.http, 503) << down.body;
    EXPECT_NE(down.body.find("ServiceUnavailable"), std::string::npos) << down.body;
  }
  const std::string more = "written while the object server is down";
  EXPECT_EQ(Send(*server, "PUT", "/ckpt-bucket/obj2", secret, &more).http, 503);

  absl::Status restarted = server->RestartServer("object");
  ASSERT_TRUE(restarted.ok()) << restarted;
  Reply up = Send(*server, "GET", "/ckpt-bucket/obj", secret);
  EXPECT_EQ(up.http, 200) << up.body;
  EXPECT_EQ(up.body, data);
  EXPECT_FALSE(server->KillServer("no-such-server").ok());
}

TEST(S3TestServerTest, DestructionStopsTheServerAndRemovesItsDirectory) {
  std::unique_ptr<S3TestServer> server = StartOrFail();
  ASSERT_NE(server, nullptr);
  const std::string log_dir = server->log_dir();
  struct stat st;
  ASSERT_EQ(::stat(log_dir.c_str(), &st), 0) << log_dir;
  ASSERT_EQ(Send(*server, "PUT", "/ckpt-bucket", server->secret_access_key()).http, 200);
  // A copy of what a request needs, since the server object goes away.
  const std::string endpoint = server->endpoint();
  server.reset();
  EXPECT_NE(::stat(log_dir.c_str(), &st), 0) << log_dir << " is still there";
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, (endpoint + "/healthcheck").c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  EXPECT_EQ(curl_easy_perform(curl), CURLE_COULDNT_CONNECT) << endpoint << " still answers";
  curl_easy_cleanup(curl);
}

TEST(S3TestServerTest, StartPastItsDeadlineFailsInTimeNamingTheLogDir) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<S3TestServer>> server =
      S3TestServer::Start(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(server.ok()) << "Swift started within 300 ms";
  EXPECT_EQ(server.status().code(), absl::StatusCode::kDeadlineExceeded) << server.status();
  EXPECT_NE(server.status().message().find("/logs"), absl::string_view::npos) << server.status();
  EXPECT_LT(took, absl::Seconds(5)) << server.status();
}

}  // namespace
}  // namespace ckpt
