// Receive plans kept per (source layout, destination layout) pair (issue 17, live transfer):
// a trainer publishes version after version of one layout and an inference job receives each,
// so the coordinator plans the transfer once and reuses the plan for later versions.
//
// A receive plan (coordinator/transfer_kinds.h) depends on the published manifest's layout
// (tensors, pieces, files and offsets; not the checksums, step, metadata or time: see
// ManifestLayoutDigest), on every destination rank's state description (its digest,
// RankEntry::description_digest), on which workers serve the data (the serving participants, in
// order) and on the load options. The key is all of these; a destination rank without a digest
// means no reuse. What changes per version (the memory checkpoint's path and manifest, the
// rendezvous group, the version) is patched into the kept parts by the caller. Bounded: the
// least recently used plans are dropped past `max_plans`. No gRPC or logging; thread-safe.
#ifndef CKPT_COORDINATOR_TRANSFER_PLAN_CACHE_H_
#define CKPT_COORDINATOR_TRANSFER_PLAN_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/job_state.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// SHA-256 of the deterministic serialization of `manifest` without what changes between
// versions of one layout (piece checksums, step, user metadata, creation time, writer version).
std::string ManifestLayoutDigest(const pb::Manifest& manifest);

// The cache key of a receive `op` (its first world_size ranks are the destination's) of a
// manifest with `layout_digest`, served by `serving_workers` (worker ids in serving-rank
// order), planned with `algorithm` and `budget`; "" when some destination rank has no
// description digest (then nothing is reused or kept).
std::string TransferPlanKey(const std::string& layout_digest, const Operation& op,
                            const std::vector<std::string>& serving_workers, int algorithm,
                            int64_t budget);

// See the file comment.
class TransferPlanCache {
 public:
  explicit TransferPlanCache(size_t max_plans = 16) : max_plans_(max_plans) {}

  // A copy of the plan kept under `key` (nullopt when none, or for an empty key).
  std::optional<std::vector<RankPlan>> Find(const std::string& key);
  // Keeps `plans` under `key` (ignored for an empty key).
  void Keep(const std::string& key, std::vector<RankPlan> plans);
  int64_t reused() const;
  size_t size() const;

 private:
  const size_t max_plans_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<RankPlan>> plans_;
  std::list<std::string> recency_;  // most recently used first
  int64_t reused_ = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_TRANSFER_PLAN_CACHE_H_
