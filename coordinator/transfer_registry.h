// Live transfer's names and versions (issue 17): a source job publishes its state under
// "xfer://<name>@<version>" and destination jobs receive "xfer://<name>" (the newest version)
// or "xfer://<name>@<version>". Each published version is a memory checkpoint
// (PublishedCheckpointName: "<name>.v<version>") held by the source's workers; this registry
// records which versions of each name are published, reserves a version for a publish in
// flight, and keeps only the newest K versions of each name listed. No gRPC or logging;
// thread-safe.
#ifndef CKPT_COORDINATOR_TRANSFER_REGISTRY_H_
#define CKPT_COORDINATOR_TRANSFER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transfer_path.h"

namespace ckpt::coordinator {

// The transfer path vocabulary (xfer://<name>@<version>) is common/transfer_path.h.

// The memory checkpoint a published version is kept as: "<name>.v<version>".
std::string PublishedCheckpointName(const std::string& name, int64_t version);

// One published version.
struct PublishedVersion {
  int64_t version = 0;
  std::string memory_checkpoint;  // PublishedCheckpointName
  absl::Time published;
};

// The registry. See the file comment.
class PublishedRegistry {
 public:
  // `keep_versions`: versions of each name kept listed (older ones are forgotten at the next
  // commit, so a receive in flight of the newest-but-K-1 keeps its version); at least 1.
  explicit PublishedRegistry(int keep_versions = 2)
      : keep_versions_(keep_versions < 1 ? 1 : keep_versions) {}

  int keep_versions() const { return keep_versions_; }

  // Reserves the version a publish `operation_id` of `name` will commit: `requested`, or one
  // more than the newest published or reserved version when 0. FailedPrecondition naming the
  // name, the version and the newest one when `requested` is not newer than every published or
  // reserved version (versions only grow); idempotent for the same operation. InvalidArgument
  // naming the name and the version when `requested` is negative, or 0 while the newest version
  // is 2^63-1 (the next would overflow) (NextTransferVersion).
  absl::StatusOr<int64_t> Reserve(const std::string& name, int64_t requested,
                                  const std::string& operation_id);
  // Records the version reserved by `operation_id` as published (at `now`); returns the
  // versions of its name forgotten because they fell beyond the newest K. NotFound when the
  // operation reserved nothing.
  absl::StatusOr<std::vector<PublishedVersion>> Commit(const std::string& operation_id,
                                                       absl::Time now);
  // Lists a version a worker reported holding (a coordinator restart rebuilds the registry
  // from the workers): kept in version order, then the newest K as in Commit. Returns whether
  // it is listed now (false: known already, older than the newest K, or not positive).
  bool Adopt(const std::string& name, int64_t version, absl::Time published);
  // Drops the reservation of `operation_id` (no-op once committed or unknown).
  void Release(const std::string& operation_id);
  // The version a receive of (name, requested) reads: `requested` when published, the newest
  // when 0. NotFound naming the name and the versions published (or that none is).
  absl::StatusOr<PublishedVersion> Resolve(const std::string& name, int64_t requested) const;
  // Every name with its kept versions, oldest first.
  std::map<std::string, std::vector<PublishedVersion>> List() const;
  // The name and version reserved by `operation_id` (NotFound otherwise).
  absl::StatusOr<std::pair<std::string, int64_t>> Reserved(const std::string& operation_id) const;

 private:
  struct Reservation {
    std::string name;
    int64_t version = 0;
  };
  // Newest published or reserved version of `name` (0: none). Requires mu_.
  int64_t NewestLocked(const std::string& name) const;

  const int keep_versions_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<PublishedVersion>> published_;  // name -> oldest first
  std::map<std::string, Reservation> reserved_;                     // operation id -> version
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_TRANSFER_REGISTRY_H_
