#include "proto/wire_names.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(WireNamesTest, EveryLoadAlgorithmNameParsesBackToItsEnum) {
  for (int v = pb::LoadAlgorithm_MIN; v <= pb::LoadAlgorithm_MAX; ++v) {
    const auto algorithm = static_cast<pb::LoadAlgorithm>(v);
    absl::StatusOr<pb::LoadAlgorithm> parsed = ParseLoadAlgorithm(LoadAlgorithmName(algorithm));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, algorithm);
  }
}

TEST(WireNamesTest, EveryNamedAlgorithmIsListedOnce) {
  EXPECT_EQ(LoadAlgorithmNames().size(),
            static_cast<size_t>(pb::LoadAlgorithm_MAX));  // all but UNSPECIFIED
}

TEST(WireNamesTest, EmptyNameMeansTheCoordinatorDecides) {
  EXPECT_EQ(*ParseLoadAlgorithm(""), pb::LOAD_ALGORITHM_UNSPECIFIED);
}

TEST(WireNamesTest, UnknownAlgorithmIsRejectedListingTheValidNames) {
  absl::StatusOr<pb::LoadAlgorithm> parsed = ParseLoadAlgorithm("Broadcast");
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'Broadcast'"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("overlap_all_to_all"), absl::string_view::npos);
}

TEST(WireNamesTest, KindsAndPhasesReadAsUsersSeeThem) {
  EXPECT_EQ(MemoryKindName(pb::MEMORY_HOST), "host");
  EXPECT_EQ(MemoryKindName(pb::MEMORY_DEVICE), "device");
  EXPECT_EQ(OperationKindName(pb::OPERATION_SAVE), "save");
  EXPECT_EQ(OperationKindName(pb::OPERATION_RESHARD), "reshard");
  EXPECT_EQ(OperationPhaseName(pb::PHASE_EXECUTING), "executing");
  EXPECT_EQ(OperationPhaseName(pb::PHASE_ABORTED), "aborted");
}

}  // namespace
}  // namespace ckpt
