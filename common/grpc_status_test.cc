#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(GrpcStatusTest, OkRoundTrips) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcStatusTest, CodesAndMessagesSurviveBothWays) {
  absl::Status s = absl::DeadlineExceededError("keys missing: a, b");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(g.error_message(), "keys missing: a, b");
  absl::Status back = FromGrpcStatus(g, "Rendezvous.Get");
  EXPECT_EQ(back.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(back.message(), "Rendezvous.Get: keys missing: a, b");
}

TEST(GrpcStatusTest, EveryCanonicalCodeMapsToItself) {
  for (int c = 1; c <= 16; ++c) {
    absl::Status s(static_cast<absl::StatusCode>(c), "m");
    EXPECT_EQ(static_cast<int>(ToGrpcStatus(s).error_code()), c);
    EXPECT_EQ(static_cast<int>(FromGrpcStatus(ToGrpcStatus(s)).code()), c);
  }
}

}  // namespace
}  // namespace ckpt
