// CollectS3Garbage on a real one-node Swift with s3api (storage/s3/testing), never a mock: what
// a crashed writer leaves (objects under an uncommitted generation, an unfinished multipart
// upload, a name with no manifest, an overwrite's old generation whose delete failed) goes; the
// committed checkpoint stays whole; --dry-run and a large minimum age remove nothing.
#include "storage/s3_gc.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr char kBucket[] = "ckpt-gc-test";
constexpr char kCrashed[] = "g0123456789abcdef";  // a crashed write's generation
constexpr char kUnfinished[] = "gfedcba9876543210";

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// The binary's server, the AWS environment pointing at it (the "s3" store that
// CopyCheckpoint finds through the registry reads it).
S3TestServer& Server() {
  static S3TestServer* server = [] {
    S3TestServer* s = &S3TestServer::Shared();
    s->ExportAwsEnvironment();
    return s;
  }();
  return *server;
}

std::unique_ptr<S3Client> Client() {
  std::unique_ptr<S3Client> client = *S3Client::Create(Server().ClientOptions());
  EXPECT_TRUE(client->CreateBucket(kBucket, Deadline()).ok());
  return client;
}

// A small two-file checkpoint in `path`.
void WriteSource(const std::string& path, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string w(4 * 256, '\0'), b(200, '\0');
  for (char& c : w) c = static_cast<char>(rng());
  for (char& c : b) c = static_cast<char>(rng());
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kF32, {256}}, TensorMeta{"b", DType::kBF16, {100}}};
  contents.files = {
      DataFilePlan{0, {PieceData{"w", Region{{0}, {256}, std::nullopt}, w.data(), 1024}}},
      DataFilePlan{1, {PieceData{"b", Region{{0}, {100}, std::nullopt}, b.data(), 200}}}};
  ASSERT_TRUE(WriteCheckpoint(path, contents, WriteOptions{}).ok());
}

// Every key under `prefix`.
std::vector<std::string> Keys(S3Client& client, const std::string& prefix) {
  absl::StatusOr<S3ListPage> page = client.ListObjectsV2(kBucket, prefix, "", 1000, Deadline());
  EXPECT_TRUE(page.ok()) << page.status();
  std::vector<std::string> keys;
  if (page.ok()) {
    for (const S3ObjectInfo& o : page->objects) keys.push_back(o.key);
  }
  return keys;
}

// The generation the manifest committed at `name` names.
std::string Committed(S3Client& client, const std::string& name) {
  const std::string key = name + "/manifest.pb";
  std::string bytes(*client.HeadObject(kBucket, key, Deadline()), '\0');
  EXPECT_TRUE(client.GetObjectRange(kBucket, key, 0, absl::MakeSpan(bytes), Deadline()).ok());
  return ParseManifest(bytes, key)->object_generation();
}

// What a writer killed before its commit leaves under `name`: two objects of generation
// kCrashed and a multipart upload of generation kUnfinished with one part up.
void Crash(S3Client& client, const std::string& name) {
  for (const char* file : {"data/r0_0.safetensors", "data/r1_0.safetensors"}) {
    const std::string key = absl::StrCat(name, "/", kCrashed, "/", file);
    ASSERT_TRUE(client.PutObject(kBucket, key, std::string(3000, 'x'), Deadline()).ok());
  }
  const std::string key = absl::StrCat(name, "/", kUnfinished, "/data/r0_0.safetensors");
  absl::StatusOr<std::string> upload = client.CreateMultipartUpload(kBucket, key, Deadline());
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(client.UploadPart(kBucket, key, *upload, 1, std::string(1000, 'y'), Deadline()).ok());
}

// A committed checkpoint at s3://kBucket/`name` plus a crash's leftovers beside it, and an
// uncommitted generation under `name`-orphan (a name with no manifest at all).
void CommittedAndLeftovers(S3Client& client, const std::string& name) {
  const std::string dir = TestDir("s3-gc-" + std::to_string(std::hash<std::string>()(name)));
  WriteSource(JoinPath(dir, "src"), 1);
  absl::StatusOr<CopyReport> up =
      CopyCheckpoint(JoinPath(dir, "src"), absl::StrCat("s3://", kBucket, "/", name));
  ASSERT_TRUE(up.ok()) << up.status();
  Crash(client, name);
  ASSERT_TRUE(client
                  .PutObject(kBucket,
                             absl::StrCat(name, "-orphan/", kCrashed, "/data/r0_0.safetensors"),
                             "orphan", Deadline())
                  .ok());
}

std::vector<std::string> Urls(const S3GcReport& report) {
  std::vector<std::string> urls;
  for (const S3GcLeftover& l : report.leftovers) urls.push_back(l.url);
  return urls;
}

void ExpectCommittedCheckpointWhole(const std::string& name) {
  const std::string url = absl::StrCat("s3://", kBucket, "/", name);
  absl::StatusOr<VerifyReport> verified = VerifyStoredCheckpoint(url);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->problems.empty());
  const std::string back = JoinPath(TestDir("s3-gc-back"), "back");
  absl::StatusOr<CopyReport> down = CopyCheckpoint(url, back);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(down->files, 2);
}

TEST(S3GcTest, ACrashedWritesLeftoversGoAndTheCommittedCheckpointStaysWhole) {
  std::unique_ptr<S3Client> client = Client();
  CommittedAndLeftovers(*client, "crash/step1");
  const std::string committed = Committed(*client, "crash/step1");
  absl::StatusOr<S3GcReport> report = CollectS3Garbage(
      *client, absl::StrCat("s3://", kBucket, "/crash"), absl::ZeroDuration(), false, Deadline());
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string at = absl::StrCat("s3://", kBucket, "/crash/");
  EXPECT_THAT(
      Urls(*report),
      UnorderedElementsAre(at + "step1/" + kUnfinished + "/data/r0_0.safetensors",
                           at + "step1/" + kCrashed + "/", at + "step1-orphan/" + kCrashed + "/"));
  EXPECT_EQ(report->committed, 1);
  EXPECT_EQ(report->failed(), 0);
  for (const S3GcLeftover& l : report->leftovers) {
    if (l.url == at + "step1/" + kCrashed + "/") {
      EXPECT_EQ(l.bytes, 6000);
      EXPECT_EQ(l.objects, 2);
      EXPECT_THAT(l.reason, HasSubstr(committed));
    }
  }
  // Only the committed checkpoint is left: its manifest and its generation's two objects.
  std::vector<std::string> keys = Keys(*client, "crash/");
  EXPECT_EQ(keys.size(), 3u);
  for (const std::string& key : keys) {
    EXPECT_TRUE(key == "crash/step1/manifest.pb" ||
                absl::StartsWith(key, "crash/step1/" + committed + "/"))
        << key;
  }
  EXPECT_TRUE(client->ListMultipartUploads(kBucket, "crash/", Deadline())->empty());
  ExpectCommittedCheckpointWhole("crash/step1");
}

TEST(S3GcTest, DryRunListsTheLeftoversAndRemovesNothing) {
  std::unique_ptr<S3Client> client = Client();
  CommittedAndLeftovers(*client, "dry/step1");
  const std::vector<std::string> before = Keys(*client, "dry/");
  absl::StatusOr<S3GcReport> report = CollectS3Garbage(
      *client, absl::StrCat("s3://", kBucket, "/dry/"), absl::ZeroDuration(), true, Deadline());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->leftovers.size(), 3u);
  EXPECT_EQ(Keys(*client, "dry/"), before);
  EXPECT_EQ(client->ListMultipartUploads(kBucket, "dry/", Deadline())->size(), 1u);
}

TEST(S3GcTest, LeftoversYoungerThanTheMinimumAgeAreLeftAlone) {
  std::unique_ptr<S3Client> client = Client();
  CommittedAndLeftovers(*client, "young/step1");
  const std::vector<std::string> before = Keys(*client, "young/");
  absl::StatusOr<S3GcReport> report = CollectS3Garbage(
      *client, absl::StrCat("s3://", kBucket, "/young"), absl::Hours(1), false, Deadline());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->leftovers.empty()) << report->leftovers.front().url;
  EXPECT_EQ(report->young, 3);
  EXPECT_EQ(Keys(*client, "young/"), before);
  EXPECT_EQ(client->ListMultipartUploads(kBucket, "young/", Deadline())->size(), 1u);
}

TEST(S3GcTest, AnOverwrittenCheckpointsOldGenerationLeftBehindIsCollected) {
  std::unique_ptr<S3Client> client = Client();
  const std::string dir = TestDir("s3-gc-overwrite");
  const std::string url = absl::StrCat("s3://", kBucket, "/over/step1");
  WriteSource(JoinPath(dir, "v1"), 1);
  WriteSource(JoinPath(dir, "v2"), 2);
  ASSERT_TRUE(CopyCheckpoint(JoinPath(dir, "v1"), url).ok());
  const std::string old_generation = Committed(*client, "over/step1");
  std::vector<std::pair<std::string, std::string>> old_objects;
  for (const std::string& key : Keys(*client, "over/step1/" + old_generation + "/")) {
    std::string bytes(*client->HeadObject(kBucket, key, Deadline()), '\0');
    ASSERT_TRUE(client->GetObjectRange(kBucket, key, 0, absl::MakeSpan(bytes), Deadline()).ok());
    old_objects.emplace_back(key, std::move(bytes));
  }
  CopyOptions overwrite;
  overwrite.overwrite = true;
  ASSERT_TRUE(CopyCheckpoint(JoinPath(dir, "v2"), url, overwrite).ok());
  // The replaced generation's delete "failed": its objects are back.
  for (const auto& [key, bytes] : old_objects) {
    ASSERT_TRUE(client->PutObject(kBucket, key, bytes, Deadline()).ok());
  }
  absl::StatusOr<S3GcReport> report =
      CollectS3Garbage(*client, url, absl::ZeroDuration(), false, Deadline());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Urls(*report), ElementsAre(absl::StrCat(url, "/", old_generation, "/")));
  EXPECT_EQ(report->committed, 1);
  EXPECT_TRUE(Keys(*client, "over/step1/" + old_generation + "/").empty());
  ExpectCommittedCheckpointWhole("over/step1");
}

}  // namespace
}  // namespace ckpt
