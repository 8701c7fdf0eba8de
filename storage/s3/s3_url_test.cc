#include "storage/s3/s3_url.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

TEST(ParseS3Url, SplitsBucketAndPrefix) {
  absl::StatusOr<S3Location> loc = ParseS3Url("s3://my-bucket.data/runs/step-100/");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->bucket, "my-bucket.data");
  EXPECT_EQ(loc->prefix, "runs/step-100/");
  loc = ParseS3Url("s3://abc");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->bucket, "abc");
  EXPECT_EQ(loc->prefix, "");
}

TEST(ParseS3Url, RefusesBadBucketsNamingTheUrlAndTheRule) {
  const std::pair<const char*, const char*> cases[] = {
      {"s3://ab/x", "3 to 63"},
      {"s3://Bucket/x", "lowercase"},
      {"s3://my_bucket/x", "lowercase"},
      {"s3://-bucket/x", "start and end"},
      {"s3://bucket-/x", "start and end"},
      {"s3://my..bucket/x", "'..'"},
      {"s3://192.168.1.1/x", "IP address"},
      {"gs://bucket/x", "s3://"},
  };
  for (const auto& [url, why] : cases) {
    absl::StatusOr<S3Location> loc = ParseS3Url(url);
    ASSERT_FALSE(loc.ok()) << url;
    EXPECT_EQ(loc.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(loc.status().message(), HasSubstr(url));
    EXPECT_THAT(loc.status().message(), HasSubstr(why)) << loc.status();
  }
  EXPECT_FALSE(ParseS3Url("s3://" + std::string(64, 'a')).ok());
  EXPECT_TRUE(ParseS3Url("s3://" + std::string(63, 'a')).ok());
}

TEST(ParseS3Url, RefusesBadPrefixes) {
  const std::pair<std::string, const char*> cases[] = {
      {"s3://bucket//x", "empty path segment"},
      {"s3://bucket/a//b", "empty path segment"},
      {"s3://bucket/a/./b", "'.' or '..'"},
      {"s3://bucket/a/../b", "'.' or '..'"},
      {"s3://bucket/a\nb", "control character"},
      {"s3://bucket/a\x7f", "control character"},
      {"s3://bucket/a\xff", "UTF-8"},
      {"s3://bucket/\xc0\xaf", "UTF-8"},  // overlong '/'
      {"s3://bucket/" + std::string(1025, 'k'), "1025 bytes"},
  };
  for (const auto& [url, why] : cases) {
    absl::StatusOr<S3Location> loc = ParseS3Url(url);
    ASSERT_FALSE(loc.ok()) << url;
    EXPECT_EQ(loc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(loc.status().message(), HasSubstr("is not a valid s3:// URL"));
    EXPECT_THAT(loc.status().message(), HasSubstr(why)) << loc.status();
  }
}

TEST(ValidateObjectKey, AcceptsUtf8AndPunctuation) {
  EXPECT_TRUE(ValidateObjectKey("ckpt/step 1/model.layers.0:weight (bf16)+x=y&z").ok());
  EXPECT_TRUE(ValidateObjectKey("données/模型/ü").ok());
  EXPECT_TRUE(ValidateObjectKey(std::string(1024, 'k')).ok());
  EXPECT_FALSE(ValidateObjectKey("").ok());
  EXPECT_FALSE(ValidateObjectKey("/leading").ok());
}

TEST(S3UriEncode, EncodesEachSegmentAndKeepsSlashesOnlyInPaths) {
  EXPECT_EQ(S3UriEncode("a b/c+d~e_f-g.h", true), "a%20b/c%2Bd~e_f-g.h");
  EXPECT_EQ(S3UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(S3UriEncode("ü", true), "%C3%BC");
  EXPECT_EQ(S3UriEncode("=&?%", true), "%3D%26%3F%25");
}

TEST(S3CanonicalQuery, SortsEncodesAndWritesEmptyValues) {
  EXPECT_EQ(S3CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(S3CanonicalQuery({{"uploadId", "a/b+c"}, {"partNumber", "2"}}),
            "partNumber=2&uploadId=a%2Fb%2Bc");
  EXPECT_EQ(S3CanonicalQuery({{"prefix", "x y"}, {"list-type", "2"}, {"max-keys", "5"}}),
            "list-type=2&max-keys=5&prefix=x%20y");
}

TEST(S3RequestUrl, BuildsPathStyleAndVirtualHostedUrls) {
  absl::StatusOr<std::string> url =
      S3RequestUrl("http://127.0.0.1:8080", S3Addressing::kPath, "bkt", "a b/c", "x=1");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(*url, "http://127.0.0.1:8080/bkt/a%20b/c?x=1");
  url = S3RequestUrl("https://s3.us-east-1.amazonaws.com/", S3Addressing::kVirtualHosted, "bkt",
                     "k", "");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(*url, "https://bkt.s3.us-east-1.amazonaws.com/k");
  url = S3RequestUrl("http://h:1", S3Addressing::kPath, "bkt", "", "");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(*url, "http://h:1/bkt");
  url = S3RequestUrl("http://h:1", S3Addressing::kVirtualHosted, "bkt", "", "list-type=2");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(*url, "http://bkt.h:1/?list-type=2");
}

TEST(S3RequestUrl, RefusesEndpointsThatAreNotSchemeAndHost) {
  for (const char* endpoint :
       {"127.0.0.1:80", "ftp://h", "http://", "http://h/path", "http://user@h"}) {
    absl::StatusOr<std::string> url = S3RequestUrl(endpoint, S3Addressing::kPath, "bkt", "k", "");
    ASSERT_FALSE(url.ok()) << endpoint;
    EXPECT_THAT(url.status().message(), HasSubstr("S3 endpoint"));
  }
}

}  // namespace
}  // namespace ckpt
