#include "storage/s3/s3_url.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt {
namespace {

absl::Status BadBucket(absl::string_view bucket, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("S3 bucket name '", absl::CHexEscape(bucket), "' is not valid: ", why));
}

absl::Status BadKey(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("S3 object key '", absl::CHexEscape(key.substr(0, 200)),
                   key.size() > 200 ? "..." : "", "' is not valid: ", why));
}

bool LooksLikeIpv4(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view p : parts) {
    if (p.empty() || p.size() > 3) return false;
    for (char c : p) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
  }
  return true;
}

// The code point at s[*i] (advancing *i), or -1 when the bytes there are not valid UTF-8.
int32_t NextCodePoint(absl::string_view s, size_t* i) {
  const auto b0 = static_cast<unsigned char>(s[*i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) return -1;
  int32_t cp = len == 1 ? b0 : b0 & (0x7f >> len);
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[*i + k]);
    if ((b >> 6) != 2) return -1;
    cp = (cp << 6) | (b & 0x3f);
  }
  static constexpr int32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
  *i += len;
  return cp;
}

bool IsUnreserved(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '~';
}

}  // namespace

absl::Status ValidateBucketName(absl::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) {
    return BadBucket(
        bucket, absl::StrCat("it has ", bucket.size(), " characters; a bucket name has 3 to 63"));
  }
  for (char c : bucket) {
    const auto u = static_cast<unsigned char>(c);
    if (!(absl::ascii_islower(u) || absl::ascii_isdigit(u) || c == '.' || c == '-')) {
      return BadBucket(bucket, "only lowercase letters, digits, '.' and '-' are allowed");
    }
  }
  auto alnum = [](char c) { return c != '.' && c != '-'; };
  if (!alnum(bucket.front()) || !alnum(bucket.back())) {
    return BadBucket(bucket, "it must start and end with a letter or digit");
  }
  if (absl::StrContains(bucket, "..")) return BadBucket(bucket, "it contains '..'");
  if (LooksLikeIpv4(bucket)) return BadBucket(bucket, "it is formatted as an IP address");
  return absl::OkStatus();
}

absl::Status ValidateObjectKey(absl::string_view key) {
  if (key.empty()) return BadKey(key, "it is empty");
  if (key.size() > kS3MaxKeyBytes) {
    return BadKey(key, absl::StrCat("it has ", key.size(), " bytes; at most ", kS3MaxKeyBytes,
                                    " are allowed"));
  }
  for (size_t i = 0; i < key.size();) {
    const int32_t cp = NextCodePoint(key, &i);
    if (cp < 0) return BadKey(key, "it is not valid UTF-8");
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
      return BadKey(key, "it contains a control character");
    }
  }
  for (absl::string_view segment : absl::StrSplit(key, '/')) {
    if (segment.empty())
      return BadKey(key, "it has an empty path segment ('//' or a '/' at an end)");
    if (segment == "." || segment == "..") {
      return BadKey(key, "it has a '.' or '..' path segment");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<S3Location> ParseS3Url(absl::string_view url) {
  auto bad = [&](absl::string_view why, const absl::Status& cause = absl::OkStatus()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint location '", absl::CHexEscape(url),
                                                   "' is not a valid s3:// URL: ", why,
                                                   cause.ok() ? "" : cause.message()));
  };
  if (!absl::StartsWith(url, "s3://")) return bad("it does not start with s3://");
  absl::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (absl::Status s = ValidateBucketName(loc.bucket); !s.ok()) return bad("", s);
  if (slash == absl::string_view::npos) return loc;
  absl::string_view prefix = rest.substr(slash + 1);
  loc.prefix = std::string(prefix);
  if (prefix.empty()) return loc;
  // A trailing '/' ends a "directory" prefix; the rest must be a valid key.
  if (absl::EndsWith(prefix, "/")) prefix.remove_suffix(1);
  if (absl::Status s = ValidateObjectKey(prefix); !s.ok()) return bad("", s);
  return loc;
}

std::string S3UriEncode(absl::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(c);
    } else {
      const auto u = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

std::string S3CanonicalQuery(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [name, value] : params) {
    name = S3UriEncode(name, false);
    value = S3UriEncode(value, false);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    absl::StrAppend(&out, out.empty() ? "" : "&", name, "=", value);
  }
  return out;
}

absl::StatusOr<std::string> S3RequestUrl(absl::string_view endpoint, S3Addressing addressing,
                                         absl::string_view bucket, absl::string_view key,
                                         absl::string_view query) {
  absl::string_view scheme;
  if (absl::StartsWith(endpoint, "http://")) scheme = "http://";
  if (absl::StartsWith(endpoint, "https://")) scheme = "https://";
  absl::string_view host = endpoint.substr(scheme.size());
  if (absl::EndsWith(host, "/")) host.remove_suffix(1);
  if (scheme.empty() || host.empty() || absl::StrContains(host, "/") ||
      absl::StrContains(host, "?") || absl::StrContains(host, "@")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 endpoint '", absl::CHexEscape(endpoint),
        "' is not valid: expected http://host[:port] or https://host[:port] with no path"));
  }
  std::string url = addressing == S3Addressing::kPath
                        ? absl::StrCat(scheme, host, "/", S3UriEncode(bucket, false))
                        : absl::StrCat(scheme, S3UriEncode(bucket, false), ".", host);
  if (!key.empty() || addressing == S3Addressing::kVirtualHosted) {
    absl::StrAppend(&url, "/", S3UriEncode(key, true));
  }
  if (!query.empty()) absl::StrAppend(&url, "?", query);
  return url;
}

}  // namespace ckpt
