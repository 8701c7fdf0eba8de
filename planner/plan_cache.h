// Plans keyed by a fingerprint of everything they are computed from, so a repeated save or
// load of an unchanged layout skips planning, and any change (a region, a dtype, a rank count,
// an option, even the order of the gathered lists, which the plans depend on) misses.
#ifndef CKPT_PLANNER_PLAN_CACHE_H_
#define CKPT_PLANNER_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/load_plan.h"
#include "planner/save_plan.h"
#include "sharding/layout.h"

namespace ckpt {

// 128-bit XXH3 fingerprint of a plan's inputs (canonical, length-prefixed serialization).
struct PlanKey {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const PlanKey& a, const PlanKey& b) {
    return a.high == b.high && a.low == b.low;
  }
  friend bool operator!=(const PlanKey& a, const PlanKey& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const PlanKey& k) {
    return H::combine(std::move(h), k.high, k.low);
  }
};

PlanKey SavePlanKey(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                    const SavePlanOptions& options);
PlanKey LoadPlanKey(absl::Span<const TensorMeta> tensors, absl::Span<const StoredPieceInfo> pieces,
                    absl::Span<const LoadRequest> requests, int64_t num_ranks,
                    const LoadPlanOptions& options);

// Least-recently-used cache of save and load plans (each kind keeps up to `capacity`).
// Failed builds are not cached. Not thread-safe: the coordinator's job loop serializes calls.
class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 8);

  absl::StatusOr<std::shared_ptr<const SavePlan>> GetSavePlan(absl::Span<const TensorPiece> pieces,
                                                              int64_t num_ranks,
                                                              const SavePlanOptions& options = {});
  absl::StatusOr<std::shared_ptr<const LoadPlan>> GetLoadPlan(
      absl::Span<const TensorMeta> tensors, absl::Span<const StoredPieceInfo> pieces,
      absl::Span<const LoadRequest> requests, int64_t num_ranks,
      const LoadPlanOptions& options = {});

  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  // Key -> plan with LRU order (front = most recent).
  template <typename Plan>
  class Lru {
   public:
    std::shared_ptr<const Plan> Find(const PlanKey& key);
    void Insert(const PlanKey& key, std::shared_ptr<const Plan> plan, size_t capacity);

   private:
    std::list<std::pair<PlanKey, std::shared_ptr<const Plan>>> order_;
    absl::flat_hash_map<PlanKey, typename decltype(order_)::iterator> index_;
  };

  size_t capacity_;
  Lru<SavePlan> save_;
  Lru<LoadPlan> load_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_PLANNER_PLAN_CACHE_H_
