#include "common/store_url.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ckpt {

std::string LocationScheme(absl::string_view location) {
  const size_t colon = location.find("://");
  if (colon == absl::string_view::npos || colon == 0) return "file";
  const absl::string_view scheme = location.substr(0, colon);
  // RFC 3986: a letter, then letters, digits, '+', '-', '.'; "/ckpt/s3://x" is a path.
  if (!absl::ascii_isalpha(scheme[0])) return "file";
  for (char c : scheme) {
    if (!absl::ascii_isalnum(c) && c != '+' && c != '-' && c != '.') return "file";
  }
  return std::string(scheme);
}

bool IsObjectStoreLocation(absl::string_view location) {
  return LocationScheme(location) != "file";
}

std::string AbsoluteLocation(const std::string& location) {
  if (location.empty() || location.find("://") != std::string::npos) return location;
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(location, ec);
  return ec ? location : absolute.string();
}

absl::StatusOr<std::string> NormalizeObjectStoreUrl(absl::string_view url, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", url, "' is not a valid object-store URL: ", why,
                     " (give scheme://bucket[/prefix], e.g. s3://bucket/checkpoints)"));
  };
  const std::string scheme = LocationScheme(url);
  if (scheme == "file") return bad("it has no scheme other than file://");
  for (char c : scheme) {
    if (absl::ascii_isupper(c)) return bad("the scheme must be lower case");
  }
  absl::string_view rest = url.substr(scheme.size() + 3);
  for (char c : rest) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') {
      return bad("it contains a control character or a backslash");
    }
  }
  if (absl::EndsWith(rest, "/")) rest.remove_suffix(1);
  if (rest.empty()) return bad("it names no bucket");
  std::vector<absl::string_view> parts = absl::StrSplit(rest, '/');
  if (parts[0].empty()) return bad("the bucket is empty");
  for (absl::string_view part : parts) {
    if (part.empty()) return bad("it contains an empty component ('//')");
    if (part == "." || part == "..") return bad("it contains a '.' or '..' component");
  }
  return absl::StrCat(scheme, "://", absl::StrJoin(parts, "/"));
}

}  // namespace ckpt
