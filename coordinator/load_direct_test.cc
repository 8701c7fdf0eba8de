#include "coordinator/load_direct.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "coordinator/two_row_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "storage/file_util.h"
#include "storage/manifest_file.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

pb::ManifestShare ShareOf(const RankPlan& plan) {
  pb::LoadPlanPart part;
  EXPECT_TRUE(part.ParseFromString(plan.part.Bytes()));
  pb::ManifestShare share;
  EXPECT_FALSE(part.manifest_share().empty());
  EXPECT_TRUE(share.ParseFromString(part.manifest_share()));
  return share;
}

TEST(LoadDirectTest, EachPartCarriesOnlyThePiecesItsReadsOverlap) {
  const std::string path = WriteTwoRowCheckpoint("direct-share");
  auto plans = PlanDirectLoad(ThreeRankLoad(path));
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 3u);
  for (int r : {0, 1}) {
    pb::ManifestShare share = ShareOf((*plans)[r]);
    EXPECT_EQ(share.pieces_size(), 2) << "rank " << r;
    EXPECT_EQ(share.files_size(), 2) << "rank " << r;
    ASSERT_EQ(share.tensors_size(), 1);
    EXPECT_EQ(share.tensors(0).key(), "w");
  }
  pb::ManifestShare row1 = ShareOf((*plans)[2]);
  ASSERT_EQ(row1.pieces_size(), 1);
  EXPECT_EQ(row1.pieces(0).region().offsets(0), 1);
  ASSERT_EQ(row1.files_size(), 1);
  EXPECT_EQ(row1.pieces(0).writer_rank(), 1);
}

TEST(LoadDirectTest, AMissingDataFileFailsThePlanNamingIt) {
  const std::string path = WriteTwoRowCheckpoint("direct-missing-file");
  absl::StatusOr<pb::Manifest> manifest = ReadManifestFile(path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string gone = JoinPath(path, manifest->files(1).name());
  ASSERT_EQ(::unlink(gone.c_str()), 0);
  auto plans = PlanDirectLoad(ThreeRankLoad(path));
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kNotFound) << plans.status();
  EXPECT_THAT(std::string(plans.status().message()), HasSubstr(gone));
}

TEST(LoadDirectTest, ATruncatedDataFileIsDataLossNamingIt) {
  const std::string path = WriteTwoRowCheckpoint("direct-truncated-file");
  absl::StatusOr<pb::Manifest> manifest = ReadManifestFile(path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string cut = JoinPath(path, manifest->files(0).name());
  ASSERT_EQ(::truncate(cut.c_str(), manifest->files(0).size_bytes() - 1), 0);
  auto plans = PlanDirectLoad(ThreeRankLoad(path));
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kDataLoss) << plans.status();
  EXPECT_THAT(std::string(plans.status().message()), HasSubstr(cut));
  EXPECT_THAT(std::string(plans.status().message()), HasSubstr("truncated"));
}

TEST(LoadDirectTest, ARankGivingAnotherShapeIsNamedEvenWhenStoredPiecesDoNotFitIt) {
  const std::string path = WriteTwoRowCheckpoint("direct-shape");
  Operation op = ThreeRankLoad(path);
  op.ranks[2].shards = {Rows(0, 1, /*rows=*/1)};  // w as 1 x 4: row 1's piece does not fit
  auto plans = PlanDirectLoad(op);
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument) << plans.status();
  EXPECT_THAT(std::string(plans.status().message()), HasSubstr("rank 2 asks for tensor w"));
}

TEST(LoadDirectTest, AnIncompleteCheckpointIsRefusedNamingIt) {
  const std::string path = WriteTwoRowCheckpoint("direct-incomplete");
  ASSERT_EQ(::unlink(JoinPath(path, "manifest.pb").c_str()), 0);
  auto plans = PlanDirectLoad(ThreeRankLoad(path));
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kFailedPrecondition) << plans.status();
  EXPECT_THAT(std::string(plans.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace ckpt::coordinator
