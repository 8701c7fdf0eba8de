// ckptctl against s3:// on a real one-node Swift with s3api (storage/s3/testing), as a user runs
// it: credentials, region and endpoint in the standard AWS environment variables; copy a
// directory checkpoint up, inspect and verify it there, catch a tampered object, copy it back;
// import to, export from (read in place), diff (in place) and reshard with s3:// URLs.
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::Ckptctl;
using ::testing::HasSubstr;
using ::testing::Not;
using Result = ckpt::testing::CommandResult;

constexpr char kBucket[] = "ckptctl-s3";

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A server of the test's own (each test writes the same names and changes the credentials),
// its bucket made and the AWS environment the ckptctl processes inherit pointing at it.
absl::StatusOr<std::unique_ptr<S3TestServer>> StartWithBucket() {
  absl::StatusOr<std::unique_ptr<S3TestServer>> server = S3TestServer::Start();
  if (!server.ok()) return server.status();
  absl::Status made =
      (*S3Client::Create((*server)->ClientOptions()))->CreateBucket(kBucket, Deadline());
  if (!made.ok()) return made;
  (*server)->ExportAwsEnvironment();
  return server;
}

// Flips one byte in the data of the first piece of the checkpoint committed under `prefix` (a
// key prefix of kBucket) whose directory copy is `local`; returns that piece and the URL of its
// data object.
std::pair<pb::StoredPiece, std::string> TamperFirstPiece(S3Client& client,
                                                         const std::string& prefix,
                                                         const std::string& local) {
  const std::string manifest_key = prefix + "/manifest.pb";
  std::string manifest_bytes(*client.HeadObject(kBucket, manifest_key, Deadline()), '\0');
  EXPECT_TRUE(
      client.GetObjectRange(kBucket, manifest_key, 0, absl::MakeSpan(manifest_bytes), Deadline())
          .ok());
  const pb::Manifest manifest = *ParseManifest(manifest_bytes, manifest_key);
  const pb::StoredPiece& piece = manifest.pieces(0);
  const std::string key =
      absl::StrCat(prefix, "/", manifest.object_generation(), "/", piece.file());
  std::string object = *ReadWholeFile(JoinPath(local, piece.file()), 1 << 30);
  object[piece.byte_offset() + 10] ^= 1;
  EXPECT_TRUE(client.PutObject(kBucket, key, object, Deadline()).ok());
  return {piece, absl::StrCat("s3://", kBucket, "/", key)};
}

TEST(CkptctlS3Test, CopyInspectVerifyAndBackThroughTheAwsEnvironment) {
  absl::StatusOr<std::unique_ptr<S3TestServer>> server = StartWithBucket();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<S3Client> client = *S3Client::Create((*server)->ClientOptions());

  const std::string dir = ckpt::testing::FreshDir("ckptctl-s3");
  const std::string w = Bytes(64 * 1024 * 4, 1), b = Bytes(200, 2);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"layer.w", DType::kF32, {64, 1024}},
                      TensorMeta{"layer.b", DType::kBF16, {100}}};
  contents.files = {
      DataFilePlan{0,
                   {PieceData{"layer.w", Region{{0, 0}, {32, 1024}, std::nullopt}, w.data(),
                              32 * 1024 * 4}}},
      DataFilePlan{1,
                   {PieceData{"layer.w", Region{{32, 0}, {32, 1024}, std::nullopt},
                              w.data() + 32 * 1024 * 4, 32 * 1024 * 4},
                    PieceData{"layer.b", Region{{0}, {100}, std::nullopt}, b.data(), 200}}}};
  const std::string local = JoinPath(dir, "step1");
  ASSERT_TRUE(WriteCheckpoint(local, contents, WriteOptions{}).ok());
  const std::string url = absl::StrCat("s3://", kBucket, "/runs/step1");

  Result up = Ckptctl("copy " + local + " " + url);
  ASSERT_EQ(up.code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("3 pieces verified"));
  Result inspect = Ckptctl("inspect " + url);
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("layer.w"));
  EXPECT_THAT(inspect.out, HasSubstr("layer.b"));
  Result verify = Ckptctl("verify " + url);
  ASSERT_EQ(verify.code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("OK"));
  Result back = Ckptctl("copy " + url + " " + JoinPath(dir, "back"));
  ASSERT_EQ(back.code, 0) << back.err;
  EXPECT_EQ(Ckptctl("diff " + local + " " + JoinPath(dir, "back")).code, 0);

  // One flipped byte in a data object: verify names the piece; a copy refuses it.
  const pb::StoredPiece piece = TamperFirstPiece(*client, "runs/step1", local).first;
  Result bad = Ckptctl("verify " + url);
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("checksum mismatch"));
  EXPECT_THAT(bad.err, HasSubstr(piece.key()));
  Result refused = Ckptctl("copy " + url + " " + JoinPath(dir, "refused"));
  EXPECT_EQ(refused.code, 1);
  EXPECT_FALSE(PathExists(JoinPath(dir, "refused")));

  // Wrong credentials: PermissionDenied naming the key id, never the secret.
  ::setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-987654321", 1);
  Result denied = Ckptctl("inspect " + url);
  EXPECT_EQ(denied.code, 1);
  EXPECT_THAT(denied.err, HasSubstr((*server)->access_key_id()));
  EXPECT_THAT(denied.err, Not(HasSubstr("wrong-secret-987654321")));
}

// The offline commands that read a checkpoint (export, diff, in-process reshard's source) read
// an s3:// URL in place: run with a $TMPDIR that does not exist (where the earlier private local
// copies failed to be made), they give what the directory gives, and a tampered object is an
// error naming it. Those that write one (import; reshard's destination) and
// export --to dcp (its converter opens files by path) go through a private local copy under
// $TMPDIR, removed afterwards.
TEST(CkptctlS3Test, ReadSideCommandsReadS3InPlaceAndWritesGoThroughPrivateCopies) {
  absl::StatusOr<std::unique_ptr<S3TestServer>> server = StartWithBucket();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string dir = ckpt::testing::FreshDir("ckptctl-s3-offline");
  const std::string tmp = JoinPath(dir, "tmp");  // the ckptctl processes' $TMPDIR
  ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0);
  ::setenv("TMPDIR", tmp.c_str(), 1);
  auto tmp_is_empty = [&] { return ListDir(tmp)->empty(); };

  const std::string w = Bytes(16 * 64 * 4, 5), b = Bytes(32, 6);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"layer.w", DType::kF32, {16, 64}},
                      TensorMeta{"layer.b", DType::kBF16, {16}}};
  contents.files = {DataFilePlan{
      0,
      {PieceData{"layer.w", Region{{0, 0}, {16, 64}, std::nullopt}, w.data(), 16 * 64 * 4},
       PieceData{"layer.b", Region{{0}, {16}, std::nullopt}, b.data(), 32}}}};
  const std::string local = JoinPath(dir, "step1");
  ASSERT_TRUE(WriteCheckpoint(local, contents, WriteOptions{}).ok());
  const std::string hf = JoinPath(dir, "hf");
  ASSERT_EQ(Ckptctl("export " + local + " " + hf).code, 0);
  const std::string s3 = absl::StrCat("s3://", kBucket, "/offline/");

  // import <safetensors dir> s3://...: then verify and inspect it there.
  Result imported = Ckptctl("import " + hf + " " + s3 + "imported");
  ASSERT_EQ(imported.code, 0) << imported.err;
  EXPECT_THAT(imported.out, HasSubstr("into " + s3 + "imported"));
  EXPECT_TRUE(tmp_is_empty());
  Result verify = Ckptctl("verify " + s3 + "imported");
  ASSERT_EQ(verify.code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("OK"));
  Result inspect = Ckptctl("inspect " + s3 + "imported");
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("layer.w"));
  Result again = Ckptctl("import " + hf + " " + s3 + "imported");
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, HasSubstr(s3 + "imported"));
  EXPECT_THAT(again.err, HasSubstr("--overwrite"));
  EXPECT_EQ(Ckptctl("import " + hf + " " + s3 + "imported --overwrite").code, 0);
  // Safetensors and DCP files live in local directories only: a URL there is refused.
  for (const std::string& cmd : {"export " + s3 + "imported " + s3 + "exported",
                                 "export --to dcp " + s3 + "imported " + s3 + "exported",
                                 "import " + s3 + "imported " + s3 + "again"}) {
    Result refused = Ckptctl(cmd);
    EXPECT_EQ(refused.code, 2) << cmd;
    EXPECT_THAT(refused.err, HasSubstr("is an object-store URL")) << cmd;
  }
  EXPECT_FALSE(PathExists("s3:"));  // nothing written under the working directory

  // export from s3 writes what export from the directory writes; diff finds them identical;
  // reshard from s3 to a directory holds the same tensors: none of them touches $TMPDIR.
  ASSERT_EQ(Ckptctl("copy " + local + " " + s3 + "step1").code, 0);
  const std::string no_tmp = JoinPath(dir, "no-such-tmp");  // never created
  auto in_place = [&](const std::string& cmd) {
    ::setenv("TMPDIR", no_tmp.c_str(), 1);
    Result r = Ckptctl(cmd);
    ::setenv("TMPDIR", tmp.c_str(), 1);
    return r;
  };
  const std::string layout = JoinPath(dir, "tp2.json");
  ASSERT_TRUE(WriteFileAtomically(layout,
                                  "{\"world_size\": 2, \"mesh\": {\"tp\": 2}, \"rules\": "
                                  "[{\"match\": \"*\", \"placements\": [\"Shard(0)\"]}]}")
                  .ok());
  Result exported = in_place("export " + s3 + "step1 " + JoinPath(dir, "hf-from-s3"));
  ASSERT_EQ(exported.code, 0) << exported.err;
  EXPECT_EQ(*ReadWholeFile(JoinPath(dir, "hf-from-s3/model.safetensors"), 1 << 20),
            *ReadWholeFile(JoinPath(hf, "model.safetensors"), 1 << 20));
  Result diff = in_place("diff " + local + " " + s3 + "step1");
  ASSERT_EQ(diff.code, 0) << diff.out << diff.err;
  EXPECT_THAT(diff.out, HasSubstr("identical"));
  EXPECT_THAT(diff.out, HasSubstr("B: ckpt checkpoint " + s3 + "step1"));
  Result both = in_place("diff " + s3 + "imported " + s3 + "step1");
  EXPECT_EQ(both.code, 0) << both.out << both.err;
  const std::string tp2_dir = JoinPath(dir, "tp2-dir");
  Result to_dir = in_place("reshard " + s3 + "step1 " + tp2_dir + " --layout " + layout);
  ASSERT_EQ(to_dir.code, 0) << to_dir.err;
  EXPECT_THAT(to_dir.out, HasSubstr("(2 ranks)"));
  EXPECT_FALSE(PathExists(no_tmp));
  EXPECT_TRUE(tmp_is_empty());

  // export --to dcp from s3: through a verified private copy (the converter reads files by
  // path), removed afterwards. One converter start-up (~5 s) only: the conversion itself is
  // tested on directories (tests/python), and import --from dcp publishes to a URL exactly as
  // the import of safetensors above does (WritableCheckpoint).
  const std::string dcp = JoinPath(dir, "dcp");
  Result to_dcp = Ckptctl("export --to dcp " + s3 + "step1 " + dcp);
  ASSERT_EQ(to_dcp.code, 0) << to_dcp.err;
  EXPECT_TRUE(PathExists(JoinPath(dcp, ".metadata")));
  EXPECT_TRUE(tmp_is_empty());

  // Offline reshard from s3 to s3: the destination holds the layout's pieces, same tensors.
  Result reshard = Ckptctl("reshard " + s3 + "step1 " + s3 + "tp2 --layout " + layout);
  ASSERT_EQ(reshard.code, 0) << reshard.err;
  Result resharded = Ckptctl("inspect " + s3 + "tp2 --json");
  ASSERT_EQ(resharded.code, 0) << resharded.err;
  EXPECT_THAT(resharded.out, HasSubstr("\"world_size\": 2"));
  EXPECT_EQ(Ckptctl("diff " + local + " " + s3 + "tp2").code, 0);
  EXPECT_TRUE(tmp_is_empty());

  // A checkpoint that is not there: NotFound naming the URL, nothing left behind.
  for (const std::string& cmd : {"export " + s3 + "missing " + JoinPath(dir, "never"),
                                 "diff " + local + " " + s3 + "missing"}) {
    Result missing = Ckptctl(cmd);
    EXPECT_NE(missing.code, 0) << cmd;
    EXPECT_THAT(missing.err, HasSubstr(s3 + "missing")) << cmd;
    EXPECT_THAT(missing.err, HasSubstr("no checkpoint is committed at " + s3 + "missing")) << cmd;
  }
  EXPECT_FALSE(PathExists(JoinPath(dir, "never")));
  EXPECT_TRUE(tmp_is_empty());

  // One flipped byte in a data object: each read-side command fails naming the object.
  std::unique_ptr<S3Client> client = *S3Client::Create((*server)->ClientOptions());
  const auto [piece, object_url] = TamperFirstPiece(*client, "offline/step1", local);
  for (const std::string& cmd :
       {"export " + s3 + "step1 " + JoinPath(dir, "hf-bad"), "diff " + local + " " + s3 + "step1",
        "reshard " + s3 + "step1 " + JoinPath(dir, "tp2-bad") + " --layout " + layout}) {
    Result bad = in_place(cmd);
    EXPECT_NE(bad.code, 0) << cmd;
    EXPECT_THAT(bad.err, HasSubstr(object_url)) << cmd;
    EXPECT_THAT(bad.err, HasSubstr("checksum mismatch")) << cmd;
  }
  EXPECT_FALSE(PathExists(JoinPath(dir, "tp2-bad")));
  EXPECT_FALSE(PathExists(no_tmp));
}

TEST(CkptctlS3Test, GcRemovesACrashedWritesLeftoversAndKeepsTheCommittedCheckpoint) {
  absl::StatusOr<std::unique_ptr<S3TestServer>> server = StartWithBucket();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<S3Client> client = *S3Client::Create((*server)->ClientOptions());

  const std::string dir = ckpt::testing::FreshDir("ckptctl-s3-gc");
  const std::string b = Bytes(200, 3);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"layer.b", DType::kBF16, {100}}};
  contents.files = {
      DataFilePlan{0, {PieceData{"layer.b", Region{{0}, {100}, std::nullopt}, b.data(), 200}}}};
  const std::string local = JoinPath(dir, "step1");
  ASSERT_TRUE(WriteCheckpoint(local, contents, WriteOptions{}).ok());
  const std::string url = absl::StrCat("s3://", kBucket, "/runs/step1");
  Result up = Ckptctl("copy " + local + " " + url);
  ASSERT_EQ(up.code, 0) << up.err;
  // A writer killed before its commit: an object of its generation and an unfinished upload.
  const std::string crashed = "runs/step1/g00000000deadbeef/data/r0_0.safetensors";
  ASSERT_TRUE(client->PutObject(kBucket, crashed, Bytes(5000, 4), Deadline()).ok());
  ASSERT_TRUE(client->CreateMultipartUpload(kBucket, crashed, Deadline()).ok());

  const std::string gc = absl::StrCat("gc s3://", kBucket, "/runs --min-age 0");
  Result young = Ckptctl(absl::StrCat("gc s3://", kBucket, "/runs"));  // default 1h: all young
  ASSERT_EQ(young.code, 0) << young.err;
  EXPECT_THAT(young.out, HasSubstr("gc: 0 removed"));
  Result dry = Ckptctl(gc + " --dry-run");
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr(absl::StrCat("would remove s3://", kBucket,
                                              "/runs/step1/g00000000deadbeef/ (4.88 KiB")));
  EXPECT_THAT(dry.out, HasSubstr("would remove multipart upload"));
  EXPECT_TRUE(client->HeadObject(kBucket, crashed, Deadline()).ok());
  Result removed = Ckptctl(gc);
  ASSERT_EQ(removed.code, 0) << removed.err;
  EXPECT_THAT(removed.out, HasSubstr("removed s3://"));
  EXPECT_THAT(removed.out, HasSubstr("gc: 2 removed"));
  EXPECT_THAT(removed.out, HasSubstr("1 committed generations kept"));
  EXPECT_TRUE(absl::IsNotFound(client->HeadObject(kBucket, crashed, Deadline()).status()));
  EXPECT_TRUE(client->ListMultipartUploads(kBucket, "runs/", Deadline())->empty());
  Result verify = Ckptctl("verify " + url);
  ASSERT_EQ(verify.code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("OK"));
  Result again = Ckptctl(gc);
  EXPECT_THAT(again.out, HasSubstr("gc: 0 removed"));
}

}  // namespace
}  // namespace ckpt
