// The s3:// store on a real one-node Swift with s3api (storage/s3/testing): the checkpoint
// store conformance suite through the registry (credentials and endpoint from the AWS
// environment variables, as a user sets them), copies to and from a directory with multipart
// uploads, and the faults of issue 43: tampered and truncated objects, the server killed in the
// middle of a write, wrong credentials, a missing bucket, an invalid bucket name.
#include "storage/s3_store.h"

#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_store_conformance.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "storage/test_dir.h"
#include "storage/verify.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kBucket[] = "ckpt-store-test";

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// The binary's server (S3TestServer::Shared), its bucket made once, and the AWS environment
// pointing at it (so the "s3" store the registry makes finds it the way a user's would).
S3TestServer& Server() {
  static S3TestServer* server = &S3TestServer::SharedWithBucket(kBucket);
  return *server;
}

// Every key under the checkpoint at `url` (listed with the client), less its committed
// manifest and the data objects that manifest names; and every multipart upload under it.
std::vector<std::string> Leftovers(const std::string& url) {
  const std::string prefix = url.substr(absl::StrCat("s3://", kBucket, "/").size());
  std::unique_ptr<S3Client> client = *S3Client::Create(Server().ClientOptions());
  std::set<std::string> committed;
  const std::string manifest_key = prefix + "/manifest.pb";
  if (absl::StatusOr<int64_t> size = client->HeadObject(kBucket, manifest_key, Deadline());
      size.ok()) {
    std::string bytes(*size, '\0');
    EXPECT_TRUE(
        client->GetObjectRange(kBucket, manifest_key, 0, absl::MakeSpan(bytes), Deadline()).ok());
    absl::StatusOr<pb::Manifest> manifest = ParseManifest(bytes, manifest_key);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    committed.insert(manifest_key);
    for (const pb::DataFile& file : manifest->files()) {
      committed.insert(absl::StrCat(prefix, "/", manifest->object_generation(), "/", file.name()));
    }
  }
  std::vector<std::string> left;
  std::string token;
  do {
    absl::StatusOr<S3ListPage> page =
        client->ListObjectsV2(kBucket, prefix + "/", token, 1000, Deadline());
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) break;
    for (const S3ObjectInfo& object : page->objects) {
      if (committed.count(object.key) == 0) left.push_back(object.key);
    }
    token = page->next_continuation_token;
  } while (!token.empty());
  absl::StatusOr<std::vector<S3MultipartUpload>> uploads =
      client->ListMultipartUploads(kBucket, prefix + "/", Deadline());
  EXPECT_TRUE(uploads.ok()) << uploads.status();
  if (uploads.ok()) {
    for (const S3MultipartUpload& upload : *uploads) left.push_back("upload " + upload.key);
  }
  return left;
}

StoreBackend S3Backend() {
  StoreBackend backend;
  backend.name = "S3";
  backend.store = [] {
    Server();
    return StoreForUrl("s3://bucket/x");
  };
  backend.prefix = [](const std::string& test) {
    return absl::StrCat("s3://", kBucket, "/conformance/", test);
  };
  backend.leftovers = [](const std::string& url) { return Leftovers(url); };
  return backend;
}

INSTANTIATE_TEST_SUITE_P(S3, CheckpointStoreConformanceTest, ::testing::Values(S3Backend()),
                         StoreBackendName);

// A store on the test server with 5 MiB parts (Swift's minimum) and a short retry policy.
std::unique_ptr<CheckpointStore> DirectStore(std::string secret = "") {
  S3StoreOptions options;
  options.client = Server().ClientOptions();
  if (!secret.empty()) options.client.credentials.secret_access_key = secret;
  options.client.retry.max_attempts = 3;
  options.client.retry.initial_backoff = absl::Milliseconds(20);
  options.client.retry.max_backoff = absl::Milliseconds(100);
  options.client.connect_timeout = absl::Seconds(2);
  options.multipart.part_size = int64_t{5} << 20;
  options.multipart.parts_in_flight = 2;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = MakeS3Store(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// A checkpoint in a directory: a [3, 1048576] float32 tensor (12 MiB, so its data file goes up
// in several parts) in row pieces of two writer ranks, and a small bf16 vector.
pb::Manifest WriteSource(const std::string& path, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<std::string>> bytes;
  auto piece = [&](const std::string& key, Region region, int64_t size) {
    bytes.push_back(std::make_unique<std::string>(size, '\0'));
    for (char& c : *bytes.back()) c = static_cast<char>(rng());
    return PieceData{key, std::move(region), bytes.back()->data(), size};
  };
  constexpr int64_t kCols = 1 << 20;
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kF32, {3, kCols}},
                      TensorMeta{"b", DType::kBF16, {100}}};
  contents.files = {
      DataFilePlan{0, {piece("w", Region{{0, 0}, {2, kCols}, std::nullopt}, 2 * kCols * 4)}},
      DataFilePlan{1,
                   {piece("w", Region{{2, 0}, {1, kCols}, std::nullopt}, kCols * 4),
                    piece("b", Region{{0}, {100}, std::nullopt}, 200)}}};
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(path, contents, WriteOptions{});
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return manifest.ok() ? *manifest : pb::Manifest();
}

// The key of data file `name` of the checkpoint committed at s3://kBucket/`prefix`.
std::string DataKey(S3Client& client, const std::string& prefix, const std::string& name) {
  const std::string manifest_key = prefix + "/manifest.pb";
  absl::StatusOr<int64_t> size = client.HeadObject(kBucket, manifest_key, Deadline());
  EXPECT_TRUE(size.ok()) << size.status();
  std::string bytes(*size, '\0');
  EXPECT_TRUE(
      client.GetObjectRange(kBucket, manifest_key, 0, absl::MakeSpan(bytes), Deadline()).ok());
  absl::StatusOr<pb::Manifest> manifest = ParseManifest(bytes, manifest_key);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return absl::StrCat(prefix, "/", manifest->object_generation(), "/", name);
}

std::unique_ptr<S3Client> Client() { return *S3Client::Create(Server().ClientOptions()); }

void ExpectSameCheckpoint(const std::string& a, const std::string& b) {
  absl::StatusOr<pb::Manifest> ma = ReadManifestFile(a);
  absl::StatusOr<pb::Manifest> mb = ReadManifestFile(b);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_EQ(ma->SerializeAsString(), mb->SerializeAsString());
  absl::StatusOr<VerifyReport> verified = VerifyCheckpoint(b, IoOptions{});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->problems.empty());
}

TEST(S3StoreTest, ACheckpointCopiedToS3AndBackIsTheSameCheckpoint) {
  Server();
  const std::string dir = TestDir("s3-copy");
  const std::string from = JoinPath(dir, "from"), back = JoinPath(dir, "back");
  const pb::Manifest manifest = WriteSource(from, 1);
  const std::string url = absl::StrCat("s3://", kBucket, "/copy/step1");
  absl::StatusOr<CopyReport> up = CopyCheckpoint(from, url);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->pieces_verified, manifest.pieces_size());
  absl::StatusOr<CopyReport> down = CopyCheckpoint(url, back);
  ASSERT_TRUE(down.ok()) << down.status();
  ExpectSameCheckpoint(from, back);
}

TEST(S3StoreTest, ATamperedOrTruncatedObjectIsDataLossAndNothingIsCommitted) {
  Server();
  const std::string dir = TestDir("s3-tampered");
  const std::string from = JoinPath(dir, "from");
  const pb::Manifest manifest = WriteSource(from, 2);
  const std::string prefix = "tampered/step1";
  const std::string url = absl::StrCat("s3://", kBucket, "/", prefix);
  ASSERT_TRUE(CopyCheckpoint(from, url).ok());
  std::unique_ptr<S3Client> client = Client();
  const pb::DataFile& small = manifest.files(1);  // holds "w" rows 2: and "b"
  const std::string key = DataKey(*client, prefix, small.name());
  std::string bytes = *ReadWholeFile(JoinPath(from, small.name()), 1 << 30);
  bytes[bytes.size() - 7] ^= 0x20;  // inside the last piece
  ASSERT_TRUE(client->PutObject(kBucket, key, bytes, Deadline()).ok());
  absl::StatusOr<CopyReport> tampered = CopyCheckpoint(url, JoinPath(dir, "tampered"));
  EXPECT_EQ(tampered.status().code(), absl::StatusCode::kDataLoss) << tampered.status();
  EXPECT_THAT(tampered.status().message(), HasSubstr("checksum"));
  EXPECT_EQ(ProbeCheckpoint(JoinPath(dir, "tampered")).state, CheckpointState::kMissing);

  bytes.resize(bytes.size() - 100);
  ASSERT_TRUE(client->PutObject(kBucket, key, bytes, Deadline()).ok());
  absl::StatusOr<CopyReport> truncated = CopyCheckpoint(url, JoinPath(dir, "truncated"));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss) << truncated.status();
  EXPECT_THAT(truncated.status().message(), HasSubstr(key));
  EXPECT_EQ(ProbeCheckpoint(JoinPath(dir, "truncated")).state, CheckpointState::kMissing);
}

TEST(S3StoreTest, AServerKilledMidWriteIsAnErrorNamingTheObjectAndTheOldCheckpointStays) {
  S3TestServer& server = Server();
  const std::string dir = TestDir("s3-killed");
  const pb::Manifest old_manifest = WriteSource(JoinPath(dir, "old"), 3);
  const pb::Manifest new_manifest = WriteSource(JoinPath(dir, "new"), 4);
  std::unique_ptr<CheckpointStore> store = DirectStore();
  const std::string url = absl::StrCat("s3://", kBucket, "/killed/step1");
  ASSERT_TRUE(CopyCheckpoint(JoinPath(dir, "old"), url).ok());

  StoreWriteOptions overwrite;
  overwrite.overwrite = true;
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store->BeginWrite(url, overwrite, Deadline());
  ASSERT_TRUE(write.ok()) << write.status();
  const pb::DataFile& big = new_manifest.files(0);
  const std::string bytes = *ReadWholeFile(JoinPath(JoinPath(dir, "new"), big.name()), 1 << 30);
  std::unique_ptr<ObjectWriter> writer = *(*write)->Create(big.name());
  ASSERT_TRUE(writer->Append(absl::string_view(bytes).substr(0, 6 << 20)).ok());
  ASSERT_TRUE(server.KillProxy().ok());
  absl::Status failed = writer->Append(absl::string_view(bytes).substr(6 << 20));
  if (failed.ok()) failed = writer->Close(Deadline());
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr(kBucket));
  EXPECT_THAT(failed.message(), HasSubstr(big.name()));
  writer.reset();
  ASSERT_TRUE(server.RestartProxy().ok());
  ASSERT_TRUE((*write)->Abort(Deadline()).ok());
  // The old checkpoint is whole, and no multipart upload is left behind.
  ASSERT_TRUE(CopyCheckpoint(url, JoinPath(dir, "back")).ok());
  ExpectSameCheckpoint(JoinPath(dir, "old"), JoinPath(dir, "back"));
  absl::StatusOr<std::vector<S3MultipartUpload>> uploads =
      Client()->ListMultipartUploads(kBucket, "killed/", Deadline());
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty()) << uploads->front().key;
}

TEST(S3StoreTest, AnObjectDeletedBehindAWritesBackFailsItsCommitAndTheOldCheckpointStays) {
  Server();
  const std::string dir = TestDir("s3-gone");
  WriteSource(JoinPath(dir, "old"), 5);
  const pb::Manifest new_manifest = WriteSource(JoinPath(dir, "new"), 6);
  std::unique_ptr<CheckpointStore> store = DirectStore();
  const std::string prefix = "gone/step1";
  const std::string url = absl::StrCat("s3://", kBucket, "/", prefix);
  ASSERT_TRUE(CopyCheckpoint(JoinPath(dir, "old"), url).ok());
  std::unique_ptr<S3Client> client = Client();
  const std::string old_key = DataKey(*client, prefix, new_manifest.files(1).name());

  StoreWriteOptions overwrite;
  overwrite.overwrite = true;
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store->BeginWrite(url, overwrite, Deadline());
  ASSERT_TRUE(write.ok()) << write.status();
  for (const pb::DataFile& file : new_manifest.files()) {
    std::unique_ptr<ObjectWriter> writer = *(*write)->Create(file.name());
    ASSERT_TRUE(
        writer->Append(*ReadWholeFile(JoinPath(JoinPath(dir, "new"), file.name()), 1 << 30)).ok());
    ASSERT_TRUE(writer->Close(Deadline()).ok());
  }
  // The new write's copy of files(1) (not the committed one) goes, as a gc would remove it.
  absl::StatusOr<S3ListPage> page =
      client->ListObjectsV2(kBucket, prefix + "/", "", 1000, Deadline());
  ASSERT_TRUE(page.ok()) << page.status();
  std::string new_key;
  for (const S3ObjectInfo& object : page->objects) {
    if (object.key != old_key && absl::EndsWith(object.key, new_manifest.files(1).name())) {
      new_key = object.key;
    }
  }
  ASSERT_FALSE(new_key.empty());
  ASSERT_TRUE(client->DeleteObject(kBucket, new_key, Deadline()).ok());
  absl::Status committed = (*write)->Commit(new_manifest, Deadline());
  EXPECT_EQ(committed.code(), absl::StatusCode::kFailedPrecondition) << committed;
  EXPECT_THAT(committed.message(), HasSubstr(new_key));
  ASSERT_TRUE((*write)->Abort(Deadline()).ok());
  ASSERT_TRUE(CopyCheckpoint(url, JoinPath(dir, "back")).ok());
  ExpectSameCheckpoint(JoinPath(dir, "old"), JoinPath(dir, "back"));
}

TEST(S3StoreTest, AJoinedWritersUploadInFlightFailsWhenTheBeginningWriteAbortsAndLeavesNothing) {
  Server();
  const std::string dir = TestDir("s3-joined-multipart");
  const pb::Manifest manifest = WriteSource(dir, 7);
  std::unique_ptr<CheckpointStore> store = DirectStore();
  const std::string url = absl::StrCat("s3://", kBucket, "/joined-multipart/step1");
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store->BeginWrite(url, StoreWriteOptions{}, Deadline());
  ASSERT_TRUE(write.ok()) << write.status();
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> joined =
      store->JoinWrite((*write)->staging_url(), Deadline());
  ASSERT_TRUE(joined.ok()) << joined.status();
  const pb::DataFile& big = manifest.files(0);  // 8 MiB: a multipart upload of 5 MiB parts
  const std::string bytes = *ReadWholeFile(JoinPath(dir, big.name()), 1 << 30);
  std::unique_ptr<ObjectWriter> writer = *(*joined)->Create(big.name());
  ASSERT_TRUE(writer->Append(absl::string_view(bytes).substr(0, 6 << 20)).ok());
  // The coordinator gives up on the save: the worker's upload is aborted under it.
  ASSERT_TRUE((*write)->Abort(Deadline()).ok());
  absl::Status failed = writer->Append(absl::string_view(bytes).substr(6 << 20));
  if (failed.ok()) failed = writer->Close(Deadline());
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr(big.name()));
  writer.reset();
  joined->reset();
  EXPECT_THAT(Leftovers(url), ::testing::IsEmpty());
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> late =
      store->JoinWrite((*write)->staging_url(), Deadline());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound) << late.status();
}

TEST(S3StoreTest, WrongCredentialsArePermissionDeniedNamingTheKeyIdButNeverTheSecret) {
  const std::string secret = "not-the-secret-0123456789";
  std::unique_ptr<CheckpointStore> store = DirectStore(secret);
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> opened =
      store->Open(absl::StrCat("s3://", kBucket, "/anything"), Deadline());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kPermissionDenied) << opened.status();
  EXPECT_THAT(opened.status().message(), HasSubstr(Server().access_key_id()));
  EXPECT_THAT(opened.status().message(), Not(HasSubstr(secret)));
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write = store->BeginWrite(
      absl::StrCat("s3://", kBucket, "/anything"), StoreWriteOptions{}, Deadline());
  EXPECT_EQ(write.status().code(), absl::StatusCode::kPermissionDenied) << write.status();
  EXPECT_THAT(write.status().message(), Not(HasSubstr(secret)));
}

TEST(S3StoreTest, AMissingBucketIsNotFoundNamingItAndABadNameIsRefusedBeforeAnyRequest) {
  std::unique_ptr<CheckpointStore> store = DirectStore();
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store->BeginWrite("s3://no-such-bucket-here/a", StoreWriteOptions{}, Deadline());
  EXPECT_EQ(write.status().code(), absl::StatusCode::kNotFound) << write.status();
  EXPECT_THAT(write.status().message(), HasSubstr("no-such-bucket-here"));
  for (const std::string& url :
       std::vector<std::string>{"s3://Bad_Bucket/a", "s3://ab/a", absl::StrCat("s3://", kBucket),
                                absl::StrCat("s3://", kBucket, "/a/../b")}) {
    absl::StatusOr<std::unique_ptr<CheckpointWrite>> bad =
        store->BeginWrite(url, StoreWriteOptions{}, Deadline());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << url << ": " << bad.status();
  }
}

TEST(S3StoreTest, TheEnvironmentSetsPartSizeAddressingAndCaBundleAndBadValuesNameTheVariable) {
  Server();  // sets the AWS_* variables
  ::setenv("CKPT_S3_PART_SIZE", "67108864", 1);
  ::setenv("CKPT_S3_PARTS_IN_FLIGHT", "2", 1);
  ::setenv("CKPT_S3_ADDRESSING", "virtual", 1);
  ::setenv("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt", 1);
  absl::StatusOr<S3StoreOptions> options = S3StoreOptionsFromEnvironment();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->multipart.part_size, 64 << 20);
  EXPECT_EQ(options->multipart.parts_in_flight, 2);
  EXPECT_EQ(options->client.addressing, S3Addressing::kVirtualHosted);
  EXPECT_EQ(options->client.ca_file, "/etc/ssl/certs/ca-certificates.crt");
  EXPECT_EQ(options->client.endpoint, Server().endpoint());
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"CKPT_S3_PART_SIZE", "1000"},
                                                        {"CKPT_S3_PART_SIZE", "8MB"},
                                                        {"CKPT_S3_PARTS_IN_FLIGHT", "0"},
                                                        {"CKPT_S3_ADDRESSING", "sideways"}}) {
    const char* before = std::getenv(name);
    const std::string kept = before != nullptr ? before : "";
    ::setenv(name, value, 1);
    absl::StatusOr<S3StoreOptions> bad = S3StoreOptionsFromEnvironment();
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << name << "=" << value;
    EXPECT_THAT(bad.status().message(), HasSubstr(name));
    ::setenv(name, kept.c_str(), 1);
  }
  for (const char* name :
       {"CKPT_S3_PART_SIZE", "CKPT_S3_PARTS_IN_FLIGHT", "CKPT_S3_ADDRESSING", "AWS_CA_BUNDLE"}) {
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace ckpt
