// Paths of live transfer (issue 17): "xfer://<name>@<version>" names a published version of a
// source job's state, "xfer://<name>" the newest one, and a receive may add "?verify". The one
// place that recognises, parses and builds them (client, coordinator, worker and ckptctl use
// it), beside common/memory_path. Pure.
#ifndef CKPT_COMMON_TRANSFER_PATH_H_
#define CKPT_COMMON_TRANSFER_PATH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

inline constexpr absl::string_view kTransferPathPrefix = "xfer://";
inline constexpr absl::string_view kTransferVerifySuffix = "?verify";
// Names are memory checkpoint names with room for ".v<version>" (common/memory_path.h).
inline constexpr size_t kMaxTransferNameLength = 100;

// A parsed transfer path.
struct TransferPath {
  std::string name;
  int64_t version = 0;  // 0: none given (publish: the next; receive: the newest)
  bool verify = false;  // "?verify" (receives only)
};

// True when `path` starts with "xfer://" (whether or not the rest is valid).
bool IsTransferPath(absl::string_view path);

// "xfer://<name>[@<version>][?verify]": the name 1-100 characters of letters, digits, '.', '_'
// and '-' (not "." or ".."), the version a positive decimal integer that fits in 63 bits.
// InvalidArgument naming the path (escaped, cut) and what is wrong otherwise: an empty or bad
// name, a missing, zero, negative, signed, overflowing or non-decimal version, a second '@',
// any other suffix.
absl::StatusOr<TransferPath> ParseTransferPath(absl::string_view path);

// The version a publish of `name` takes: `requested` when positive, else (0) one more than
// `newest`, the newest version published (or being published) so far (0: none). InvalidArgument
// naming the name and the version when `requested` or `newest` is negative (a version is a
// positive 63-bit integer; 0 means "the next"), or when the next one would overflow int64
// (`newest` is 2^63-1: no version can follow it). Whether `requested` is newer than `newest`
// is the caller's check (the registry's FailedPrecondition).
absl::StatusOr<int64_t> NextTransferVersion(absl::string_view name, int64_t requested,
                                            int64_t newest);

// The version a receive of `name` asks for: `requested` (0: the newest). InvalidArgument naming
// the name and the version when it is negative.
absl::Status CheckReceiveVersion(absl::string_view name, int64_t requested);

// "xfer://<name>@<version>" ("xfer://<name>" for version 0), with "?verify" when `verify`.
std::string TransferPathString(absl::string_view name, int64_t version, bool verify = false);

// The name part of a transfer path without validating it ("xfer://p@3?verify" -> "p"); `path`
// itself when it is not a transfer path.
std::string TransferNameOf(absl::string_view path);

}  // namespace ckpt

#endif  // CKPT_COMMON_TRANSFER_PATH_H_
