// S3Client riding out a real 503 storm: a one-node Swift with s3api (storage/s3/testing) whose
// object server is killed, so its proxy answers every object request with 503
// ServiceUnavailable, until the test restarts it. Never a mock. The retries are seen through
// S3RetryPolicy::on_retry, so the test knows the storm was met without sleeping.
#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "storm-bucket";
constexpr int64_t kMiB = int64_t{1} << 20;
// Slack for a call that ends at its deadline: curl's timer and a loaded 2-core machine.
constexpr absl::Duration kSlack = absl::Seconds(1);

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = gen();
    std::copy_n(reinterpret_cast<const char*>(&v), std::min<size_t>(8, n - i), &out[i]);
  }
  return out;
}

// One retry as the client reported it.
struct SeenRetry {
  std::string op, bucket, key;
  int attempt = 0;
  int http_status = 0;
};

// Records the retries the client reports; `storm_met()` is notified at the first 503 retry of
// `key` (from the callback; the test waits on it in its own thread).
class StormObserver {
 public:
  explicit StormObserver(std::string key) : key_(std::move(key)) {}

  void OnRetry(const S3RetryEvent& e) {
    absl::MutexLock lock(&mu_);
    seen_.push_back({e.op, std::string(e.bucket), std::string(e.key), e.attempt, e.http_status});
    if (e.http_status == 503 && e.key == key_ && !storm_met_.HasBeenNotified()) {
      storm_met_.Notify();
    }
  }
  absl::Notification& storm_met() { return storm_met_; }
  std::vector<SeenRetry> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  const std::string key_;
  absl::Mutex mu_;
  std::vector<SeenRetry> seen_;
  absl::Notification storm_met_;
};

class S3RetryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<S3TestServer>> server = S3TestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(server_->ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->CreateBucket(kBucket, absl::Now() + absl::Seconds(30)).ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(server_, nullptr); }
  void TearDown() override {
    if (object_down_) {
      EXPECT_TRUE(server_->RestartServer("object").ok());
    }
  }

  // A client retrying every 20-100 ms (jittered) until the deadline, reporting to `observer`.
  static std::unique_ptr<S3Client> Client(StormObserver* observer,
                                          absl::Duration initial_backoff = absl::Milliseconds(20),
                                          absl::Duration max_backoff = absl::Milliseconds(100)) {
    S3ClientOptions o = server_->ClientOptions();
    o.retry.max_attempts = 1000000;  // the deadline, not the count, ends a storm
    o.retry.initial_backoff = initial_backoff;
    o.retry.max_backoff = max_backoff;
    o.retry.on_retry = [observer](const S3RetryEvent& e) { observer->OnRetry(e); };
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(std::move(o));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  void KillObjectServer() {
    ASSERT_TRUE(server_->KillServer("object").ok());
    object_down_ = true;
  }

  // Kills the object server, runs `call` in a thread, restarts the object server once the
  // observer has seen a 503 retry, and returns what the call returned.
  absl::Status RideOutStorm(StormObserver* observer, const std::function<absl::Status()>& call) {
    KillObjectServer();
    absl::Status result = absl::UnknownError("the call did not run");
    std::thread caller([&] { result = call(); });
    const bool met = observer->storm_met().WaitForNotificationWithTimeout(absl::Seconds(30));
    EXPECT_TRUE(met) << "no 503 retry was reported";
    const absl::Status restarted = server_->RestartServer("object");
    EXPECT_TRUE(restarted.ok()) << restarted;
    object_down_ = !restarted.ok();
    caller.join();
    return result;
  }

  // The retries of `key` the observer saw: all 503s of `op` on kBucket, numbered from 1.
  static void ExpectStormRetries(StormObserver& observer, const std::string& op,
                                 const std::string& key) {
    int n = 0;
    for (const SeenRetry& r : observer.seen()) {
      if (r.key != key) continue;
      ++n;
      EXPECT_EQ(r.op, op);
      EXPECT_EQ(r.bucket, kBucket);
      EXPECT_EQ(r.http_status, 503);
      EXPECT_EQ(r.attempt, n);
    }
    EXPECT_GE(n, 1) << "no retry of " << key;
  }

  static S3TestServer* server_;
  bool object_down_ = false;
};

S3TestServer* S3RetryTest::server_ = nullptr;

TEST_F(S3RetryTest, PutObjectRidesOutA503StormWithinItsDeadline) {
  const std::string key = "storm/put";
  StormObserver observer(key);
  std::unique_ptr<S3Client> client = Client(&observer);
  ASSERT_NE(client, nullptr);
  const std::string data = RandomBytes(kMiB, 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const absl::Status put =
      RideOutStorm(&observer, [&] { return client->PutObject(kBucket, key, data, deadline); });
  EXPECT_TRUE(put.ok()) << put;
  EXPECT_LT(absl::Now(), deadline);
  ExpectStormRetries(observer, "PutObject", key);
  std::string back(data.size(), '\0');
  ASSERT_TRUE(
      client->GetObjectRange(kBucket, key, 0, absl::MakeSpan(back), absl::Now() + absl::Seconds(30))
          .ok());
  EXPECT_TRUE(back == data);
}

TEST_F(S3RetryTest, UploadPartRidesOutA503StormWithinItsDeadline) {
  const std::string key = "storm/multipart";
  StormObserver observer(key);
  std::unique_ptr<S3Client> client = Client(&observer);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> upload =
      client->CreateMultipartUpload(kBucket, key, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(upload.ok()) << upload.status();
  const std::string data = RandomBytes(kMiB, 2);  // the last (and only) part may be small
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<std::string> etag;
  const absl::Status part = RideOutStorm(&observer, [&] {
    etag = client->UploadPart(kBucket, key, *upload, 1, data, deadline);
    return etag.status();
  });
  ASSERT_TRUE(part.ok()) << part;
  EXPECT_LT(absl::Now(), deadline);
  ExpectStormRetries(observer, "UploadPart", key);
  ASSERT_TRUE(client
                  ->CompleteMultipartUpload(kBucket, key, *upload, {{1, *etag}},
                                            absl::Now() + absl::Seconds(30))
                  .ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE(
      client->GetObjectRange(kBucket, key, 0, absl::MakeSpan(back), absl::Now() + absl::Seconds(30))
          .ok());
  EXPECT_TRUE(back == data);
}

TEST_F(S3RetryTest, RangedGetRidesOutA503StormWithinItsDeadline) {
  const std::string key = "storm/get";
  StormObserver observer(key);
  std::unique_ptr<S3Client> client = Client(&observer);
  ASSERT_NE(client, nullptr);
  const std::string data = RandomBytes(kMiB, 3);
  ASSERT_TRUE(client->PutObject(kBucket, key, data, absl::Now() + absl::Seconds(30)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string range(4096, '\0');
  const absl::Status get = RideOutStorm(&observer, [&] {
    return client->GetObjectRange(kBucket, key, 1000, absl::MakeSpan(range), deadline);
  });
  EXPECT_TRUE(get.ok()) << get;
  EXPECT_LT(absl::Now(), deadline);
  ExpectStormRetries(observer, "GetObject", key);
  EXPECT_TRUE(range == data.substr(1000, range.size()));
}

TEST_F(S3RetryTest, AStormThatOutlastsTheDeadlineIsUnavailableNamingTheObject) {
  const std::string key = "storm/endless";
  StormObserver observer(key);
  std::unique_ptr<S3Client> client = Client(&observer);
  ASSERT_NE(client, nullptr);
  KillObjectServer();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  const absl::Status put = client->PutObject(kBucket, key, RandomBytes(4096, 4), deadline);
  EXPECT_LT(absl::Now(), deadline + kSlack);
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_THAT(put.message(), HasSubstr(absl::StrCat("s3://", kBucket, "/", key)));
  EXPECT_THAT(put.message(), HasSubstr("HTTP 503"));
  EXPECT_THAT(put.message(), HasSubstr("deadline"));
  EXPECT_TRUE(observer.storm_met().HasBeenNotified());
  ExpectStormRetries(observer, "PutObject", key);
}

TEST_F(S3RetryTest, ADeadlineShorterThanTheBackoffEndsTheCallAtItsDeadline) {
  const std::string key = "storm/short";
  StormObserver observer(key);
  std::unique_ptr<S3Client> client = Client(&observer, absl::Seconds(60), absl::Seconds(60));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->PutObject(kBucket, key, "0123456789", absl::Now() + absl::Seconds(30)).ok());
  KillObjectServer();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  std::string out(4, '\0');
  const absl::Status get = client->GetObjectRange(kBucket, key, 2, absl::MakeSpan(out), deadline);
  // The contract (S3RetryPolicy): the attempt's 503 as Unavailable, saying the deadline cut
  // the retries, and no 60 s sleep.
  EXPECT_LT(absl::Now(), deadline + kSlack);
  EXPECT_EQ(get.code(), absl::StatusCode::kUnavailable) << get;
  EXPECT_THAT(get.message(), HasSubstr(absl::StrCat("s3://", kBucket, "/", key)));
  EXPECT_THAT(get.message(), HasSubstr("deadline"));
}

}  // namespace
}  // namespace ckpt
