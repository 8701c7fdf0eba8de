// The coordinator's load planning on an s3:// checkpoint, against a real one-node Swift with
// s3api (storage/s3/testing): the direct and exchange plans are the directory's (but for the
// path and the object generation each share carries), a rank's worker reads its bytes with its
// share alone, and a missing or truncated data object, or no checkpoint, fails the plan naming
// it.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/load_direct.h"
#include "coordinator/load_exchange.h"
#include "coordinator/two_row_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_share.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "storage/store_objects.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "ckpt-load-plan-test";

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// The binary's server, its bucket made once, and the AWS environment pointing at it.
S3TestServer& Server() {
  static S3TestServer* server = &S3TestServer::SharedWithBucket(kBucket);
  return *server;
}

// The two-row checkpoint written to a directory and copied to s3://kBucket/`name`: (dir, url).
std::pair<std::string, std::string> TwoRowsOnS3(const std::string& name) {
  Server();
  const std::string dir = WriteTwoRowCheckpoint(name);
  const std::string url = absl::StrCat("s3://", kBucket, "/", name);
  absl::StatusOr<CopyReport> copied = CopyCheckpoint(dir, url);
  EXPECT_TRUE(copied.ok()) << copied.status();
  return {dir, url};
}

// The key of data object `name` of the checkpoint at s3://kBucket/`prefix`.
std::string DataKey(const std::string& prefix, const std::string& name) {
  absl::StatusOr<pb::Manifest> manifest =
      ReadStoreManifest(absl::StrCat("s3://", kBucket, "/", prefix), Deadline());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return absl::StrCat(prefix, "/", manifest->object_generation(), "/", name);
}

// `plan`'s part with its path cleared and its share's object generation (which must be
// `generation`) cleared: what a plan of the same checkpoint in a directory holds.
std::string Normalized(const RankPlan& plan, const std::string& generation) {
  pb::LoadPlanPart part;
  EXPECT_TRUE(part.ParseFromString(plan.part.Bytes()));
  part.clear_path();
  pb::ManifestShare share;
  EXPECT_TRUE(share.ParseFromString(part.manifest_share()));
  EXPECT_EQ(share.object_generation(), generation);
  share.clear_object_generation();
  part.set_manifest_share(share.SerializeAsString());
  return part.SerializeAsString();
}

void ExpectSamePlans(const std::vector<RankPlan>& on_dir, const std::vector<RankPlan>& on_s3,
                     const std::string& generation) {
  ASSERT_EQ(on_dir.size(), on_s3.size());
  for (size_t r = 0; r < on_dir.size(); ++r) {
    EXPECT_EQ(Normalized(on_s3[r], generation), Normalized(on_dir[r], "")) << "rank " << r;
    EXPECT_EQ(on_s3[r].bytes, on_dir[r].bytes) << "rank " << r;
  }
}

TEST(LoadS3Test, ThePlansOfAnS3CheckpointAreTheDirectorysAndAShareReadsFromS3) {
  const auto [dir, url] = TwoRowsOnS3("plan");
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string generation = manifest->object_generation();
  ASSERT_FALSE(generation.empty());

  auto direct_dir = PlanDirectLoad(ThreeRankLoad(dir));
  auto direct_s3 = PlanDirectLoad(ThreeRankLoad(url));
  ASSERT_TRUE(direct_dir.ok()) << direct_dir.status();
  ASSERT_TRUE(direct_s3.ok()) << direct_s3.status();
  ExpectSamePlans(*direct_dir, *direct_s3, generation);
  const LoadPlannerOptions broadcast{pb::LOAD_BROADCAST, 1 << 20};
  auto exchange_dir = PlanExchangeLoad(ThreeRankLoad(dir), broadcast);
  auto exchange_s3 = PlanExchangeLoad(ThreeRankLoad(url), broadcast);
  ASSERT_TRUE(exchange_dir.ok()) << exchange_dir.status();
  ASSERT_TRUE(exchange_s3.ok()) << exchange_s3.status();
  ExpectSamePlans(*exchange_dir, *exchange_s3, generation);

  // Rank 2's worker: its share alone (no manifest GET) gives it row 1 from the object.
  pb::LoadPlanPart part;
  ASSERT_TRUE(part.ParseFromString((*direct_s3)[2].part.Bytes()));
  EXPECT_EQ(part.path(), url);
  pb::ManifestShare share;
  ASSERT_TRUE(share.ParseFromString(part.manifest_share()));
  absl::StatusOr<pb::Manifest> expanded = ExpandManifestShare(share);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::OpenShare(part.path(), *std::move(expanded));
  ASSERT_TRUE(reader.ok()) << reader.status();
  int32_t row[4] = {-1, -1, -1, -1};
  ASSERT_TRUE((*reader)->ReadRegion("w", Region{{1, 0}, {1, 4}, std::nullopt}, row).ok());
  EXPECT_THAT(row, ::testing::ElementsAre(4, 5, 6, 7));
}

TEST(LoadS3Test, AMissingDataObjectOrCheckpointFailsThePlanNamingIt) {
  const auto [dir, url] = TwoRowsOnS3("plan-missing");
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string key = DataKey("plan-missing", manifest->files(1).name());
  ASSERT_TRUE(
      (*S3Client::Create(Server().ClientOptions()))->DeleteObject(kBucket, key, Deadline()).ok());
  auto plans = PlanDirectLoad(ThreeRankLoad(url));
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kNotFound) << plans.status();
  EXPECT_THAT(plans.status().message(), HasSubstr(key));
  EXPECT_THAT(plans.status().message(), HasSubstr(absl::StrCat("cannot load checkpoint ", url)));

  const std::string nothing = absl::StrCat("s3://", kBucket, "/never-written");
  plans = PlanDirectLoad(ThreeRankLoad(nothing));
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kNotFound) << plans.status();
  EXPECT_THAT(plans.status().message(), HasSubstr(nothing));
}

TEST(LoadS3Test, ATruncatedDataObjectIsDataLossNamingIt) {
  const auto [dir, url] = TwoRowsOnS3("plan-truncated");
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, Deadline());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const pb::DataFile& file = manifest->files(0);
  const std::string key = DataKey("plan-truncated", file.name());
  std::string bytes = *ReadWholeFile(JoinPath(dir, file.name()), 1 << 20);
  bytes.pop_back();
  ASSERT_TRUE((*S3Client::Create(Server().ClientOptions()))
                  ->PutObject(kBucket, key, bytes, Deadline())
                  .ok());
  auto plans = PlanDirectLoad(ThreeRankLoad(url));
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kDataLoss) << plans.status();
  EXPECT_THAT(plans.status().message(), HasSubstr(key));
  EXPECT_THAT(plans.status().message(), HasSubstr("truncated"));
}

}  // namespace
}  // namespace ckpt::coordinator
