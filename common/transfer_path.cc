#include "common/transfer_path.h"

#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

bool NameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

absl::Status BadPath(absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "transfer path \"", absl::CHexEscape(path.substr(0, 200)), path.size() > 200 ? "..." : "",
      "\" ", why, " (expected xfer://<name>, xfer://<name>@<version>, either with ?verify)"));
}

}  // namespace

bool IsTransferPath(absl::string_view path) { return absl::StartsWith(path, kTransferPathPrefix); }

absl::StatusOr<TransferPath> ParseTransferPath(absl::string_view path) {
  if (!IsTransferPath(path)) return BadPath(path, "is not an xfer:// path");
  absl::string_view rest = path.substr(kTransferPathPrefix.size());
  TransferPath out;
  if (absl::EndsWith(rest, kTransferVerifySuffix)) {
    out.verify = true;
    rest.remove_suffix(kTransferVerifySuffix.size());
  }
  const size_t at = rest.find('@');
  const absl::string_view name = rest.substr(0, at);
  if (at != absl::string_view::npos) {
    const absl::string_view version = rest.substr(at + 1);
    if (version.empty() ||
        !std::all_of(version.begin(), version.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return BadPath(path, "has a version that is not a positive decimal integer");
    }
    if (!absl::SimpleAtoi(version, &out.version) || out.version <= 0) {
      return BadPath(path, "has a version that is not a positive 64-bit integer");
    }
  }
  if (name.empty() || name.size() > kMaxTransferNameLength || name == "." || name == ".." ||
      !std::all_of(name.begin(), name.end(), NameCharacter)) {
    return BadPath(path, absl::StrCat("has a name that is not 1-", kMaxTransferNameLength,
                                      " characters of letters, digits, '.', '_' and '-'"));
  }
  out.name = std::string(name);
  return out;
}

absl::StatusOr<int64_t> NextTransferVersion(absl::string_view name, int64_t requested,
                                            int64_t newest) {
  if (requested < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot publish version ", requested, " of xfer://", name,
                     ": a version is a positive integer (or 0 for one more than the newest)"));
  }
  if (newest < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot publish xfer://", name,
                                                   ": its newest version ", newest,
                                                   " is negative (a version is positive)"));
  }
  if (requested > 0) return requested;
  if (newest == std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot publish the next version of xfer://", name, ": its newest version ", newest,
        " is the largest a version can be (2^63-1); publish under another name"));
  }
  return newest + 1;
}

absl::Status CheckReceiveVersion(absl::string_view name, int64_t requested) {
  if (requested >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("cannot receive version ", requested, " of xfer://", name,
                   ": a version is a positive integer (or 0 for the newest)"));
}

std::string TransferPathString(absl::string_view name, int64_t version, bool verify) {
  std::string path = absl::StrCat(kTransferPathPrefix, name);
  if (version > 0) absl::StrAppend(&path, "@", version);
  if (verify) absl::StrAppend(&path, kTransferVerifySuffix);
  return path;
}

std::string TransferNameOf(absl::string_view path) {
  if (!IsTransferPath(path)) return std::string(path);
  const absl::string_view rest = path.substr(kTransferPathPrefix.size());
  return std::string(rest.substr(0, rest.find_first_of("@?")));
}

}  // namespace ckpt
