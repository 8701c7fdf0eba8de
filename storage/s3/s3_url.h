// S3 locations and request URLs: parsing and validating `s3://bucket/prefix`, bucket and key
// naming rules, and path-style or virtual-hosted URLs with SigV4's URI encoding. Pure: no I/O.
#ifndef CKPT_STORAGE_S3_S3_URL_H_
#define CKPT_STORAGE_S3_S3_URL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

inline constexpr size_t kS3MaxKeyBytes = 1024;

// A parsed `s3://bucket/prefix`: the prefix is empty or a valid key prefix without a leading
// '/' (a trailing '/' is kept as given).
struct S3Location {
  std::string bucket;
  std::string prefix;
};

// How the bucket appears in request URLs: `endpoint/bucket/key` or `bucket.host/key`.
enum class S3Addressing { kPath, kVirtualHosted };

// OK when `bucket` follows S3's naming rules (3-63 characters of lowercase letters, digits,
// '.' and '-'; starts and ends with a letter or digit; no ".."; not an IPv4 address); else
// InvalidArgument naming the bucket and the rule it breaks.
absl::Status ValidateBucketName(absl::string_view bucket);

// OK when `key` is a valid object key: 1-1024 bytes of valid UTF-8, no control characters,
// no leading '/', no empty, "." or ".." path segments. InvalidArgument naming the key otherwise.
absl::Status ValidateObjectKey(absl::string_view key);

// Parses `s3://bucket[/prefix]`; the prefix follows the key rules (a trailing '/' allowed).
// InvalidArgument naming the URL and what is wrong.
absl::StatusOr<S3Location> ParseS3Url(absl::string_view url);

// SigV4 URI encoding: unreserved characters (A-Z a-z 0-9 - _ . ~) kept, every other byte as
// %XX (upper case hex); '/' kept when `keep_slash` (object key paths).
std::string S3UriEncode(absl::string_view s, bool keep_slash);

// `name=value` pairs as SigV4's canonical query string: each encoded, sorted, joined by '&'
// (a key with no value is written `key=`, as the signature requires).
std::string S3CanonicalQuery(std::vector<std::pair<std::string, std::string>> params);

// The URL of `key` in `bucket` (key may be empty: the bucket itself) at `endpoint`
// ("http[s]://host[:port]", no path), followed by "?query" when the query is not empty.
// InvalidArgument when the endpoint is not such a URL.
absl::StatusOr<std::string> S3RequestUrl(absl::string_view endpoint, S3Addressing addressing,
                                         absl::string_view bucket, absl::string_view key,
                                         absl::string_view query);

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_S3_URL_H_
