// The bodies of save plan parts a worker keeps for repeat saves (issue 16). A repeat save of an
// unchanged layout reuses the job's plan: each rank's part is the same body plus a tail naming
// the new staging directory. The coordinator names each kept part's body (the operation that
// planned it, WorkItem.plan_part_body_id); the worker keeps the newest body per (job, rank),
// says so when it joins (JoinOperationRequest.held_plan_part_body), and is then sent only the
// tail. At 100k ranks that is ~100 bytes per rank instead of ~10 KB (1 GB per save).
#ifndef CKPT_WORKER_KEPT_PLAN_PARTS_H_
#define CKPT_WORKER_KEPT_PLAN_PARTS_H_

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// Thread-safe. Keeps at most `max_bodies` bodies (the oldest (job, rank) dropped first; a rank
// whose body was dropped is sent its next part whole, as its join then names none).
class KeptPlanParts {
 public:
  explicit KeptPlanParts(size_t max_bodies = 65536) : max_bodies_(max_bodies) {}

  // The id of the body kept for (job, rank); "" when none.
  std::string Held(const std::string& job, int rank) const;

  // Makes `item`'s plan_part whole. By reference: the kept body named plan_part_body_id, then
  // the tail the item carries (FailedPrecondition naming the job, rank and body when this
  // worker does not keep it). Otherwise, when the item names its body, keeps that body (its
  // first plan_part_body_size bytes; InvalidArgument when that is more than the part).
  absl::Status Resolve(pb::WorkItem& item);

 private:
  using Key = std::pair<std::string, int>;
  struct Body {
    std::string id;
    std::string bytes;
  };

  const size_t max_bodies_;
  mutable std::mutex mu_;
  // Hashed: a worker keeps a few ranks' bodies, the load generator 102,400 (issue 16).
  absl::flat_hash_map<Key, Body> bodies_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);  // first kept first
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_KEPT_PLAN_PARTS_H_
