#include "common/transfer_path.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(TransferPathTest, ParsesNamesVersionsAndVerify) {
  absl::StatusOr<TransferPath> newest = ParseTransferPath("xfer://policy");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->name, "policy");
  EXPECT_EQ(newest->version, 0);
  EXPECT_FALSE(newest->verify);
  absl::StatusOr<TransferPath> exact = ParseTransferPath("xfer://policy-7b.main@12");
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->name, "policy-7b.main");
  EXPECT_EQ(exact->version, 12);
  absl::StatusOr<TransferPath> verified = ParseTransferPath("xfer://p@9223372036854775807?verify");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->verify);
  EXPECT_EQ(verified->version, INT64_MAX);
  EXPECT_TRUE(ParseTransferPath("xfer://p?verify")->verify);
}

TEST(TransferPathTest, RefusesHostilePathsNamingThem) {
  for (const std::string& bad :
       std::vector<std::string>{"xfer://",         // empty name
                                "xfer://@3",       // empty name, a version
                                "xfer://?verify",  // empty name, verify
                                "xfer://a@",       // missing version
                                "xfer://a@0",
                                "xfer://a@-3",  // zero, negative
                                "xfer://a@+3",
                                "xfer://a@ 3",  // signed, spaced
                                "xfer://a@1x",
                                "xfer://a@0x10",                     // not decimal
                                "xfer://a@9223372036854775808",      // overflows int64
                                "xfer://a@99999999999999999999999",  // overflows
                                "xfer://a@1@2",
                                "xfer://a@@1",  // an extra '@'
                                "xfer://a/b",
                                "xfer://..",
                                "xfer://.",
                                "xfer://a b",
                                "xfer://a?check",
                                "xfer://a?verify?verify",
                                "xfer://a@1?verifyx",
                                std::string("xfer://a\0b", 10),
                                "mem://a",
                                "XFER://a",
                                "",
                                "xfer://" + std::string(101, 'n'),
                                "xfer://" + std::string(5000, '@')}) {
    absl::StatusOr<TransferPath> parsed = ParseTransferPath(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("transfer path"), std::string::npos) << bad;
    EXPECT_LT(parsed.status().message().size(), 1200u) << "the path is cut in messages";
  }
  EXPECT_TRUE(ParseTransferPath("xfer://" + std::string(100, 'n')).ok());
}

TEST(TransferPathTest, NextVersionsArePositiveAndNeverOverflow) {
  EXPECT_EQ(*NextTransferVersion("p", 0, 0), 1);
  EXPECT_EQ(*NextTransferVersion("p", 0, 41), 42);
  EXPECT_EQ(*NextTransferVersion("p", 7, 41), 7);  // older than the newest: the registry's call
  EXPECT_EQ(*NextTransferVersion("p", INT64_MAX, 3), INT64_MAX);
  for (int64_t requested : {int64_t{-1}, int64_t{-7}, INT64_MIN}) {
    absl::StatusOr<int64_t> refused = NextTransferVersion("p", requested, 0);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << requested;
    EXPECT_NE(refused.status().message().find(absl::StrCat("version ", requested, " of xfer://p")),
              std::string::npos)
        << refused.status();
  }
  absl::StatusOr<int64_t> overflow = NextTransferVersion("p", 0, INT64_MAX);
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.status().message().find("xfer://p"), std::string::npos);
  EXPECT_EQ(NextTransferVersion("p", 0, -3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckReceiveVersion("p", 0).ok());
  EXPECT_TRUE(CheckReceiveVersion("p", INT64_MAX).ok());
  EXPECT_EQ(CheckReceiveVersion("p", -7).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransferPathTest, BuildsWhatItParsesAndNamesAnyPath) {
  EXPECT_EQ(TransferPathString("p", 3), "xfer://p@3");
  EXPECT_EQ(TransferPathString("p", 0), "xfer://p");
  EXPECT_EQ(TransferPathString("p", 0, true), "xfer://p?verify");
  EXPECT_EQ(TransferPathString("p", 7, true), "xfer://p@7?verify");
  for (const char* path : {"xfer://p", "xfer://p@3", "xfer://p?verify", "xfer://p@7?verify"}) {
    absl::StatusOr<TransferPath> parsed = ParseTransferPath(path);
    ASSERT_TRUE(parsed.ok()) << path;
    EXPECT_EQ(TransferPathString(parsed->name, parsed->version, parsed->verify), path);
  }
  EXPECT_TRUE(IsTransferPath("xfer://anything"));
  EXPECT_FALSE(IsTransferPath("mem://a"));
  EXPECT_FALSE(IsTransferPath("xfer:/a"));
  EXPECT_EQ(TransferNameOf("xfer://p@3?verify"), "p");
  EXPECT_EQ(TransferNameOf("xfer://p?verify"), "p");
  EXPECT_EQ(TransferNameOf("xfer://"), "");
  EXPECT_EQ(TransferNameOf("/ckpt/x"), "/ckpt/x");
}

}  // namespace
}  // namespace ckpt
