// Cluster saves and loads at s3:// URLs (issue 43), as users run them: real ckpt_coordinator and
// ckpt_worker processes on loopback, trainer_probe ranks saving and loading through the client
// library, and a real one-node Swift with s3api (storage/s3/testing) found through the standard
// AWS environment variables the daemons inherit. Each worker writes its data files to a scratch
// directory and uploads them into the store write the coordinator began; the coordinator
// commits the manifest last. The checkpoint then verifies with ckptctl, reads back bit-exact,
// and loads into another layout; bad targets are refused naming the URL, leaving nothing. A
// memory checkpoint's background persistence to s3:// commits the same way, and so does a
// reshard the cluster's workers execute (ckptctl reshard --coordinator), to and from s3://.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout_spec.h"
#include "storage/checkpoint_store.h"
#include "storage/file_util.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kBucket[] = "cluster-s3";
const char kLease[] = "--lease_ms=5000";

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// One Swift for the binary, its bucket made, the AWS environment (inherited by every daemon
// and ckptctl the tests start) pointing at it.
S3TestServer& Server() {
  static S3TestServer* server = &S3TestServer::SharedWithBucket(kBucket);
  return *server;
}

// Every key under `prefix` in the test bucket.
std::vector<std::string> Keys(const std::string& prefix) {
  std::unique_ptr<S3Client> client = *S3Client::Create(Server().ClientOptions());
  std::vector<std::string> keys;
  std::string token;
  do {
    absl::StatusOr<S3ListPage> page =
        client->ListObjectsV2(kBucket, prefix, token, 1000, Deadline());
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) break;
    for (const S3ObjectInfo& o : page->objects) keys.push_back(o.key);
    token = page->next_continuation_token;
  } while (!token.empty());
  return keys;
}

// A cluster whose coordinator may save under s3://<kBucket>/<test> as well as its directory.
void StartCluster(Cluster& cluster, const std::string& prefix, int workers) {
  Server().ExportAwsEnvironment();  // a test with a server of its own may have changed it
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(
      {kLease, absl::StrCat("--checkpoint_root=s3://", kBucket, "/", prefix)}));
  for (int w = 0; w < workers; ++w) cluster.StartWorker(w);
}

TEST(S3ClusterTest, ASaveCommitsAVerifiedCheckpointThatLoadsIntoAnotherLayout) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, "roundtrip", 2));
  const std::string url = absl::StrCat("s3://", kBucket, "/roundtrip/step1");
  for (Child* t : RunRanks(cluster, "s3rt", 2, "save", url, {"--elements", "300000"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
  // Saved by rows, loaded by column blocks: each rank reads only its byte ranges.
  for (Child* t :
       RunRanks(cluster, "s3rt", 2, "load", url, {"--elements", "300000", "--layout", "cols"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

TEST(S3ClusterTest, ASecondSaveIsAlreadyExistsUnlessOverwritingAndTheFirstStaysWhole) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, "again", 2));
  const std::string url = absl::StrCat("s3://", kBucket, "/again/step1");
  for (Child* t : RunRanks(cluster, "s3again", 2, "save", url, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  const std::vector<std::string> committed = Keys("again/");
  for (Child* t : RunRanks(cluster, "s3again", 2, "save", url, {"--elements", "2048"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kAlreadyExists))
        << Result(*t).second;
    EXPECT_THAT(Result(*t).second, HasSubstr(url));
  }
  EXPECT_EQ(Keys("again/"), committed);  // nothing added, nothing removed
  for (Child* t :
       RunRanks(cluster, "s3again", 2, "save", url, {"--elements", "2048", "--overwrite", "1"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
  for (Child* t : RunRanks(cluster, "s3again", 2, "load", url, {"--elements", "2048"})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

TEST(S3ClusterTest, ASaveToAMissingBucketIsRefusedNamingItAndLeavesNothing) {
  Cluster cluster;
  Server();
  ASSERT_NO_FATAL_FAILURE(
      cluster.StartCoordinator({kLease, "--checkpoint_root=s3://no-such-bucket/x"}));
  cluster.StartWorker(0);
  const std::string url = "s3://no-such-bucket/x/step1";
  std::vector<Child*> ranks = RunRanks(cluster, "s3missing", 1, "save", url, {});
  EXPECT_EQ(Result(*ranks[0]).first, static_cast<int>(absl::StatusCode::kNotFound))
      << Result(*ranks[0]).second;
  EXPECT_THAT(Result(*ranks[0]).second, HasSubstr("no-such-bucket"));
}

TEST(S3ClusterTest, ASaveOutsideTheCoordinatorsRootsIsPermissionDeniedBeforeAnyRequest) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, "rooted", 1));
  const std::string url = absl::StrCat("s3://", kBucket, "/elsewhere/step1");
  std::vector<Child*> ranks = RunRanks(cluster, "s3roots", 1, "save", url, {});
  EXPECT_EQ(Result(*ranks[0]).first, static_cast<int>(absl::StatusCode::kPermissionDenied))
      << Result(*ranks[0]).second;
  EXPECT_THAT(Result(*ranks[0]).second, HasSubstr(url));
  EXPECT_THAT(Keys("elsewhere/"), IsEmpty());
}

// A directory checkpoint (TP=2 x DP=2 GPT state, ZeRO-1 flat optimizer) rewritten by the
// cluster's workers into TP=4 at an s3:// URL, then from there into TP=1 x DP=2 back in a
// directory: every element checked each time, the s3 checkpoint verified by ckptctl.
TEST(S3ClusterTest, AClusterReshardWritesToS3AndReadsFromS3BitExact) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, "reshard", 2));
  GptConfig config;
  config.layers = 2;
  config.hidden = 64;
  config.vocab = 500;
  absl::StatusOr<std::vector<TensorMeta>> tensors = GptTensors(config);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const std::string src = JoinPath(cluster.dir(), "src");
  auto written = WriteGptCheckpoint(src, *tensors, *LayoutSpec::Parse(GptLayoutJson(2, 2)),
                                    int64_t{512} << 10, WriteOptions{}, 700, {});
  ASSERT_TRUE(written.ok()) << written.status();
  auto reshard = [&](const std::string& from, const std::string& to, const std::string& json) {
    const std::string file = JoinPath(cluster.dir(), "layout.json");
    EXPECT_TRUE(WriteFileDurably(file, json).ok());
    std::string out;
    const int code = cluster.RunCkptctl(
        {"reshard", from, to, "--layout", file, "--coordinator", cluster.address()}, &out);
    EXPECT_EQ(code, 0) << out << ClusterLogs(cluster);
    auto report = CheckGptCheckpoint(to, *tensors, *LayoutSpec::Parse(json));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->bytes, TotalBytes(*tensors));
  };
  const std::string url = absl::StrCat("s3://", kBucket, "/reshard/tp4");
  ASSERT_NO_FATAL_FAILURE(reshard(src, url, GptLayoutJson(4, 1)));
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
  ASSERT_NO_FATAL_FAILURE(reshard(url, JoinPath(cluster.dir(), "tp1dp2"), GptLayoutJson(1, 2)));
}

// The server dies between the ranks' local writes and their uploads (each worker waits at its
// --upload_gate_file until the test killed the proxy): the save fails naming the bucket and the
// object it asked for, nothing is committed, the checkpoint saved before at the URL stays whole,
// and once the server is back `ckptctl gc` removes what the failed save left.
TEST(S3ClusterTest, AServerKilledBeforeTheUploadsFailsTheSaveAndLosesNothing) {
  absl::StatusOr<std::unique_ptr<S3TestServer>> own = S3TestServer::Start();
  ASSERT_TRUE(own.ok()) << own.status();
  S3TestServer& server = **own;
  std::unique_ptr<S3Client> client = *S3Client::Create(server.ClientOptions());
  ASSERT_TRUE(client->CreateBucket(kBucket, Deadline()).ok());
  server.ExportAwsEnvironment();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(
      {kLease, absl::StrCat("--checkpoint_root=s3://", kBucket, "/killed")}));
  cluster.set_worker_binary("worker/ckpt_worker_testing");  // --upload_gate_file
  const std::string gate = JoinPath(cluster.dir(), "upload-gate");
  cluster.StartWorker(0, {"--upload_gate_file=" + gate});
  const std::string url = absl::StrCat("s3://", kBucket, "/killed/step1");
  ASSERT_TRUE(WriteFileDurably(gate, "open").ok());  // the first save passes the gate
  for (Child* t : RunRanks(cluster, "s3killed", 1, "save", url, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  ASSERT_EQ(::unlink(gate.c_str()), 0);
  ASSERT_EQ(::unlink((gate + ".waiting").c_str()), 0);
  Child* rank = cluster.StartTrainer(0, "s3killed", 0, 1, "save", url,
                                     {"--elements", "2048", "--overwrite", "1"});
  ASSERT_TRUE(WaitFor([&] { return ::access((gate + ".waiting").c_str(), F_OK) == 0; }))
      << ClusterLogs(cluster);
  ASSERT_TRUE(server.KillProxy().ok());
  ASSERT_TRUE(WriteFileDurably(gate, "open").ok());
  ASSERT_TRUE(WaitFor([&] { return Finished(*rank); }, absl::Seconds(120))) << ClusterLogs(cluster);
  EXPECT_EQ(Result(*rank).first, static_cast<int>(absl::StatusCode::kUnavailable))
      << Result(*rank).second;
  // Its first request to the store names the write it joins (bucket and key).
  EXPECT_THAT(Result(*rank).second, HasSubstr(url));
  EXPECT_THAT(Result(*rank).second, HasSubstr("uploading"));
  ASSERT_TRUE(server.RestartProxy().ok());
  // The first checkpoint is whole: verified, and loads with its shape.
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
  for (Child* t : RunRanks(cluster, "s3killed", 1, "load", url, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
  // gc removes the failed save's generation (its abort could not reach the server).
  EXPECT_EQ(
      cluster.RunCkptctl({"gc", absl::StrCat("s3://", kBucket, "/killed"), "--min-age", "0"}, &out),
      0)
      << out;
  auto keys = [&] {
    std::vector<std::string> all;
    absl::StatusOr<S3ListPage> page =
        client->ListObjectsV2(kBucket, "killed/", "", 1000, Deadline());
    EXPECT_TRUE(page.ok()) << page.status();
    if (page.ok()) {
      for (const S3ObjectInfo& o : page->objects) all.push_back(o.key);
    }
    return all;
  };
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> committed =
      (*StoreForUrl(url))->Open(url, Deadline());
  ASSERT_TRUE(committed.ok()) << committed.status();
  // Left: the manifest and the first save's one data object.
  EXPECT_EQ(keys().size(), 2u) << ::testing::PrintToString(keys());
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
}

// The catalog's persistence line for memory checkpoint `name` ("" when not listed).
std::string PersistOf(Cluster& cluster, const std::string& name) {
  const pb::GetStatusResponse status = cluster.Status();
  for (const pb::MemoryCheckpointStatus& m : status.memory_checkpoints()) {
    if (m.name() == name) return m.persist();
  }
  return "";
}

TEST(S3ClusterTest, AMemorySavePersistsToS3AsACheckpointThatVerifiesAndLoads) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, "persist", 2));
  const std::string url = absl::StrCat("s3://", kBucket, "/persist/step1");
  for (Child* t : RunRanks(cluster, "s3persist", 2, "save", "mem://s3p",
                           {"--replicas", "0", "--persist_to", url})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
  ASSERT_TRUE(WaitFor([&] { return PersistOf(cluster, "s3p") == "persisted to " + url; }))
      << PersistOf(cluster, "s3p") << ClusterLogs(cluster);
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", url}, &out), 0) << out;
  for (Child* t : RunRanks(cluster, "s3persist", 2, "load", url, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

}  // namespace
}  // namespace ckpt::testing
