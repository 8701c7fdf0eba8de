#include "proto/status_detail.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(StatusDetailTest, StatusDetailRoundTrips) {
  absl::Status s = absl::DeadlineExceededError("rank 3 late");
  EXPECT_EQ(FromDetail(ToDetail(s)), s);
  EXPECT_TRUE(FromDetail(ToDetail(absl::OkStatus())).ok());
}

TEST(StatusDetailTest, HostileCodesBecomeUnknownKeepingTheirNumber) {
  for (int code : {99, -1}) {
    pb::StatusDetail weird;
    weird.set_code(code);
    weird.set_message("x");
    const absl::Status s = FromDetail(weird);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
    EXPECT_EQ(s.message(), absl::StrCat("(status code ", code, ") x"));
  }
}

}  // namespace
}  // namespace ckpt
