// S3Client and S3MultipartWriter against a real S3 server: a one-node OpenStack Swift with
// its s3api middleware on loopback (storage/s3/testing), never a mock.
#include "storage/s3/s3_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/s3/s3_multipart_writer.h"
#include "storage/s3/testing/s3_test_server.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMiB = int64_t{1} << 20;
// Swift's s3api refuses parts under 5 MiB but the last (min_segment_size, as S3).
constexpr int64_t kMinPart = 5 * kMiB;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = gen();
    std::copy_n(reinterpret_cast<const char*>(&v), std::min<size_t>(8, n - i), &out[i]);
  }
  return out;
}

class S3ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<S3TestServer>> server = S3TestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  static S3ClientOptions Options() {
    S3ClientOptions o = server_->ClientOptions();
    o.retry = {3, absl::Milliseconds(20), absl::Milliseconds(200), nullptr};
    return o;
  }

  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(Options());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    // One bucket per test, named after it.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    bucket_ = ("t-" + name).substr(0, 60);
    absl::Status created = client_->CreateBucket(bucket_, Deadline());
    ASSERT_TRUE(created.ok()) << created;
  }

  std::string Get(const std::string& key, int64_t offset, size_t n) {
    std::string out(n, '\0');
    absl::Status s = client_->GetObjectRange(bucket_, key, offset, absl::MakeSpan(out), Deadline());
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  static S3TestServer* server_;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

S3TestServer* S3ClientTest::server_ = nullptr;

TEST_F(S3ClientTest, PutThenRangedGetsReturnTheExactBytes) {
  const std::string data = RandomBytes(kMiB + 17, 1);
  const std::string key = "ckpt/step 1/data+0.safetensors";  // space and '+' are encoded
  ASSERT_TRUE(client_->PutObject(bucket_, key, data, Deadline()).ok());
  absl::StatusOr<int64_t> size = client_->HeadObject(bucket_, key, Deadline());
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, static_cast<int64_t>(data.size()));
  EXPECT_EQ(Get(key, 0, data.size()), data);
  EXPECT_EQ(Get(key, 12345, 999), data.substr(12345, 999));
  EXPECT_EQ(Get(key, data.size() - 1, 1), data.substr(data.size() - 1));
}

TEST_F(S3ClientTest, EmptyObjectRoundTrips) {
  ASSERT_TRUE(client_->PutObject(bucket_, "empty", "", Deadline()).ok());
  absl::StatusOr<int64_t> size = client_->HeadObject(bucket_, "empty", Deadline());
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 0);
}

TEST_F(S3ClientTest, MultipartUploadOfSeveralPartsReadsBackAcrossPartBoundaries) {
  const std::string data = RandomBytes(3 * kMinPart + 12345, 2);
  absl::StatusOr<std::unique_ptr<S3MultipartWriter>> writer = S3MultipartWriter::Start(
      client_.get(), bucket_, "big/object", {kMinPart, 3, absl::Seconds(30)}, Deadline());
  ASSERT_TRUE(writer.ok()) << writer.status();
  // Odd write sizes, so parts fill across writes.
  for (size_t pos = 0; pos < data.size();) {
    const size_t n = std::min<size_t>(data.size() - pos, 777777);
    ASSERT_TRUE((*writer)->Write(absl::string_view(data).substr(pos, n)).ok());
    pos += n;
  }
  absl::Status finished = (*writer)->Finish();
  ASSERT_TRUE(finished.ok()) << finished;
  EXPECT_LE((*writer)->peak_buffers(), 3 + 1);  // memory: parts_in_flight + 1 part buffers
  EXPECT_LE((*writer)->peak_uploading(), 3);
  EXPECT_GE((*writer)->peak_uploading(), 1);
  absl::StatusOr<int64_t> size = client_->HeadObject(bucket_, "big/object", Deadline());
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, static_cast<int64_t>(data.size()));
  for (int64_t boundary : {kMinPart, 2 * kMinPart, 3 * kMinPart}) {
    EXPECT_EQ(Get("big/object", boundary - 1000, 3000), data.substr(boundary - 1000, 3000));
  }
  EXPECT_EQ(Get("big/object", 0, data.size()), data);
  absl::StatusOr<std::vector<S3MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3ClientTest, PartsUnderTheServersMinimumAreRefusedOnComplete) {
  absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, "small", Deadline());
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<S3CompletedPart> parts;
  for (int n = 1; n <= 2; ++n) {
    absl::StatusOr<std::string> etag =
        client_->UploadPart(bucket_, "small", *id, n, RandomBytes(1000, n), Deadline());
    ASSERT_TRUE(etag.ok()) << etag.status();
    parts.push_back({n, *etag});
  }
  absl::Status s = client_->CompleteMultipartUpload(bucket_, "small", *id, parts, Deadline());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("EntityTooSmall"));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/small")));
  EXPECT_TRUE(client_->AbortMultipartUpload(bucket_, "small", *id, Deadline()).ok());
}

TEST_F(S3ClientTest, AbortRemovesTheUploadAndItsParts) {
  const absl::Time before = absl::Now();
  absl::StatusOr<std::unique_ptr<S3MultipartWriter>> writer = S3MultipartWriter::Start(
      client_.get(), bucket_, "aborted", {kMinPart, 2, absl::Seconds(30)}, Deadline());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(RandomBytes(kMinPart + 10, 3)).ok());
  absl::StatusOr<std::vector<S3MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "abort", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0].key, "aborted");
  EXPECT_EQ((*uploads)[0].upload_id, (*writer)->upload_id());
  // Initiated, to the server's clock on this host (listings round to the second).
  EXPECT_GE((*uploads)[0].initiated, before - absl::Seconds(2));
  EXPECT_LE((*uploads)[0].initiated, absl::Now() + absl::Seconds(2));
  ASSERT_TRUE((*writer)->Abort().ok());
  uploads = client_->ListMultipartUploads(bucket_, "", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
  EXPECT_TRUE(absl::IsNotFound(client_->HeadObject(bucket_, "aborted", Deadline()).status()));
}

TEST_F(S3ClientTest, ListPaginatesWithContinuationTokensThenDeletesRemoveEverything) {
  const absl::Time before = absl::Now();
  std::vector<std::string> keys;
  for (int i = 0; i < 7; ++i) keys.push_back(absl::StrCat("dir/obj-", i));
  for (const std::string& k : keys) ASSERT_TRUE(client_->PutObject(bucket_, k, k, Deadline()).ok());
  ASSERT_TRUE(client_->PutObject(bucket_, "other", "x", Deadline()).ok());
  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<S3ListPage> page = client_->ListObjectsV2(bucket_, "dir/", token, 3, Deadline());
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->objects.size(), 3u);
    for (const S3ObjectInfo& o : page->objects) {
      listed.push_back(o.key);
      EXPECT_EQ(o.size, static_cast<int64_t>(o.key.size()));
      EXPECT_GE(o.last_modified, before - absl::Seconds(2)) << o.key;
      EXPECT_LE(o.last_modified, absl::Now() + absl::Seconds(2)) << o.key;
    }
    token = page->next_continuation_token;
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(listed, keys);
  EXPECT_EQ(pages, 3);
  ASSERT_TRUE(client_->DeleteObject(bucket_, "other", Deadline()).ok());
  ASSERT_TRUE(client_->DeleteObject(bucket_, "never-existed", Deadline()).ok());
  absl::Status deleted = client_->DeleteObjects(bucket_, keys, Deadline());
  ASSERT_TRUE(deleted.ok()) << deleted;
  absl::StatusOr<S3ListPage> page = client_->ListObjectsV2(bucket_, "", "", 1000, Deadline());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->objects.empty());
}

TEST_F(S3ClientTest, WrongSecretIsPermissionDeniedNamingTheAccessKeyIdNeverTheSecret) {
  S3ClientOptions o = Options();
  o.credentials.secret_access_key = "issue43-wrong-secret-Zq9";
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  const absl::Status statuses[] = {
      (*client)->PutObject(bucket_, "k", "v", Deadline()),
      (*client)->HeadObject(bucket_, "k", Deadline()).status(),
      (*client)->ListObjectsV2(bucket_, "", "", 10, Deadline()).status(),
  };
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(s.message(), HasSubstr(server_->access_key_id()));
    EXPECT_THAT(s.message(), HasSubstr(bucket_));
    EXPECT_THAT(s.ToString(), Not(HasSubstr("issue43-wrong-secret")));
    EXPECT_THAT(s.ToString(), Not(HasSubstr(server_->secret_access_key())));
  }
}

TEST_F(S3ClientTest, MissingBucketIsNotFoundNamingTheBucket) {
  char buf[4];
  absl::Status s =
      client_->GetObjectRange("no-such-bucket-43", "k", 0, absl::MakeSpan(buf), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("bucket no-such-bucket-43 does not exist"));
  s = client_->ListObjectsV2("no-such-bucket-43", "", "", 10, Deadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("no-such-bucket-43"));
}

TEST_F(S3ClientTest, MissingKeyIsNotFoundNamingBucketAndKey) {
  char buf[4];
  absl::Status s =
      client_->GetObjectRange(bucket_, "no/such/key", 0, absl::MakeSpan(buf), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/no/such/key")));
  s = client_->HeadObject(bucket_, "no/such/key", Deadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/no/such/key")));
}

TEST_F(S3ClientTest, ObjectShorterThanTheRequestedRangeIsDataLossNamingItAndTheCounts) {
  ASSERT_TRUE(client_->PutObject(bucket_, "short", RandomBytes(100, 4), Deadline()).ok());
  std::string buf(100, '\0');
  absl::Status s = client_->GetObjectRange(bucket_, "short", 50, absl::MakeSpan(buf), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/short")));
  EXPECT_THAT(s.message(), HasSubstr("[50, 150) requested (100 bytes)"));
  EXPECT_THAT(s.message(), HasSubstr("sent 50 bytes"));
  // A range starting past the end (416 InvalidRange).
  s = client_->GetObjectRange(bucket_, "short", 200, absl::MakeSpan(buf), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/short")));
}

TEST_F(S3ClientTest, PassedDeadlineIsDeadlineExceeded) {
  absl::Status s = client_->PutObject(bucket_, "late", "x", absl::Now() - absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/late")));
}

TEST_F(S3ClientTest, VirtualHostedAddressingReachesTheSameObjects) {
  S3ClientOptions o = Options();
  o.addressing = S3Addressing::kVirtualHosted;
  // s3api serves BUCKET.localhost:PORT; libcurl resolves *.localhost to loopback.
  o.endpoint = absl::StrCat("http://localhost:", o.endpoint.substr(o.endpoint.rfind(':') + 1));
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(client_->PutObject(bucket_, "a/b c", "hello", Deadline()).ok());
  std::string buf(5, '\0');
  absl::Status s = (*client)->GetObjectRange(bucket_, "a/b c", 0, absl::MakeSpan(buf), Deadline());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(buf, "hello");
}

TEST_F(S3ClientTest, SettingsFromTheAwsEnvironmentVariablesReachTheServer) {
  const std::map<std::string, std::string> env = {
      {"AWS_ACCESS_KEY_ID", server_->access_key_id()},
      {"AWS_SECRET_ACCESS_KEY", server_->secret_access_key()},
      {"AWS_REGION", server_->region()},
      {"AWS_ENDPOINT_URL_S3", server_->endpoint()}};
  absl::StatusOr<S3Settings> settings =
      LoadS3Settings([&](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  ASSERT_TRUE(settings.ok()) << settings.status();
  absl::StatusOr<std::unique_ptr<S3Client>> client =
      S3Client::Create(S3ClientOptionsFrom(*settings));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->PutObject(bucket_, "from-env", "x", Deadline());
  EXPECT_TRUE(s.ok()) << s;
}

// A server that accepts the connection and never answers (a listening socket nobody
// accepts from): the call ends at its deadline with DeadlineExceeded naming the object.
TEST(S3ClientDeadline, ServerThatNeverAnswersIsDeadlineExceededAtTheDeadline) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  S3ClientOptions o;
  o.endpoint = absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port));
  o.credentials = {"AKID43", "secret43", ""};
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->PutObject("bucket", "hangs", "x", start + absl::Milliseconds(500));
  const absl::Duration took = absl::Now() - start;
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("s3://bucket/hangs"));
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(5));  // not the retry policy's attempts on top
}

// Names are checked before any request: a client whose endpoint has no server answers
// InvalidArgument, not Unavailable.
TEST(S3ClientNames, InvalidBucketOrKeyIsRefusedBeforeAnyRequest) {
  S3ClientOptions o;
  o.endpoint = "http://127.0.0.1:1";
  o.credentials = {"AKID43", "secret43", ""};
  o.retry = {1, absl::Milliseconds(1), absl::Milliseconds(1), nullptr};
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->PutObject("Bad_Bucket", "k", "v", Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("Bad_Bucket"));
  s = (*client)->HeadObject("good-bucket", "a//b", Deadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("a//b"));
  // The same valid request does reach the network (and fails there).
  s = (*client)->HeadObject("good-bucket", "a/b", Deadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("gave up after 1 attempt"));
}

TEST_F(S3ClientTest, ProxyKilledMidMultipartUploadIsUnavailableThenTheUploadCanBeAborted) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<S3MultipartWriter>> writer = S3MultipartWriter::Start(
      client_.get(), bucket_, "killed/data", {kMinPart, 2, absl::Seconds(2)}, deadline);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string upload_id = (*writer)->upload_id();
  ASSERT_TRUE((*writer)->Write(RandomBytes(kMinPart, 5)).ok());
  ASSERT_TRUE(server_->KillProxy().ok());
  absl::Status s = (*writer)->Write(RandomBytes(kMinPart, 6));
  if (s.ok()) s = (*writer)->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("s3://", bucket_, "/killed/data")));
  EXPECT_THAT(s.message(), HasSubstr("gave up after 3 attempts"));  // the retry policy's 3
  EXPECT_LT(absl::Now(), deadline);
  ASSERT_TRUE(server_->RestartProxy().ok());
  absl::StatusOr<std::vector<S3MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "killed/", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0].upload_id, upload_id);
  ASSERT_TRUE(client_->AbortMultipartUpload(bucket_, "killed/data", upload_id, Deadline()).ok());
  uploads = client_->ListMultipartUploads(bucket_, "killed/", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
  EXPECT_TRUE(absl::IsNotFound(client_->HeadObject(bucket_, "killed/data", Deadline()).status()));
}

TEST_F(S3ClientTest, ConnectionsRefusedWhileTheProxyRestartsAreRetriedUntilItAnswers) {
  ASSERT_TRUE(server_->KillProxy().ok());
  S3ClientOptions o = Options();
  o.retry = {200, absl::Milliseconds(50), absl::Milliseconds(200), nullptr};
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  // The proxy takes seconds to come back: the first attempts are refused and retried.
  absl::Status restarted;
  std::thread restart([&] { restarted = server_->RestartProxy(); });
  absl::Status put = (*client)->PutObject(bucket_, "after-restart", "ok", Deadline());
  restart.join();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(put.ok()) << put;
  std::string buf(2, '\0');
  EXPECT_TRUE(
      (*client)->GetObjectRange(bucket_, "after-restart", 0, absl::MakeSpan(buf), Deadline()).ok());
  EXPECT_EQ(buf, "ok");
}

}  // namespace
}  // namespace ckpt
