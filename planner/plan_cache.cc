#include "planner/plan_cache.h"

#include <string>
#include <vector>

#include "xxhash.h"

namespace ckpt {
namespace {

// Streams a canonical encoding of the inputs into XXH3-128: every string and list is
// length-prefixed, so distinct inputs never encode to the same bytes.
class Fingerprinter {
 public:
  Fingerprinter() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~Fingerprinter() { XXH3_freeState(state_); }
  Fingerprinter(const Fingerprinter&) = delete;
  Fingerprinter& operator=(const Fingerprinter&) = delete;

  void Int(int64_t v) { XXH3_128bits_update(state_, &v, sizeof(v)); }
  void Str(const std::string& s) {
    Int(static_cast<int64_t>(s.size()));
    XXH3_128bits_update(state_, s.data(), s.size());
  }
  void Ints(const std::vector<int64_t>& v) {
    Int(static_cast<int64_t>(v.size()));
    if (!v.empty()) XXH3_128bits_update(state_, v.data(), v.size() * sizeof(int64_t));
  }
  void Reg(const Region& r) {
    Ints(r.offsets);
    Ints(r.lengths);
    Int(r.flat.has_value());
    if (r.flat) {
      Int(r.flat->start);
      Int(r.flat->stop);
    }
  }
  PlanKey Finish() {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    return PlanKey{h.high64, h.low64};
  }

 private:
  XXH3_state_t* state_;
};

}  // namespace

PlanKey SavePlanKey(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                    const SavePlanOptions& options) {
  Fingerprinter f;
  f.Str("save-plan-v1");
  f.Int(num_ranks);
  f.Int(options.target_file_bytes);
  f.Int(static_cast<int64_t>(pieces.size()));
  for (const TensorPiece& p : pieces) {
    f.Str(p.key);
    f.Int(p.rank);
    f.Int(static_cast<int64_t>(p.dtype));
    f.Ints(p.global_shape);
    f.Reg(p.region);
    f.Ints(p.replica_id);
  }
  return f.Finish();
}

PlanKey LoadPlanKey(absl::Span<const TensorMeta> tensors, absl::Span<const StoredPieceInfo> pieces,
                    absl::Span<const LoadRequest> requests, int64_t num_ranks,
                    const LoadPlanOptions& options) {
  Fingerprinter f;
  f.Str("load-plan-v1");
  f.Int(num_ranks);
  f.Int(static_cast<int64_t>(options.algorithm));
  f.Int(options.memory_budget_bytes);
  f.Int(static_cast<int64_t>(tensors.size()));
  for (const TensorMeta& t : tensors) {
    f.Str(t.key);
    f.Int(static_cast<int64_t>(t.dtype));
    f.Ints(t.global_shape);
  }
  f.Int(static_cast<int64_t>(pieces.size()));
  for (const StoredPieceInfo& p : pieces) {
    f.Str(p.key);
    f.Reg(p.region);
    f.Str(p.file);
    f.Int(p.byte_offset);
    f.Int(p.byte_length);
  }
  f.Int(static_cast<int64_t>(requests.size()));
  for (const LoadRequest& r : requests) {
    f.Int(r.rank);
    f.Str(r.key);
    f.Reg(r.region);
  }
  return f.Finish();
}

template <typename Plan>
std::shared_ptr<const Plan> PlanCache::Lru<Plan>::Find(const PlanKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

template <typename Plan>
void PlanCache::Lru<Plan>::Insert(const PlanKey& key, std::shared_ptr<const Plan> plan,
                                  size_t capacity) {
  if (capacity == 0) return;
  if (auto it = index_.find(key); it != index_.end()) {
    it->second->second = std::move(plan);
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.emplace_front(key, std::move(plan));
  index_[key] = order_.begin();
  while (order_.size() > capacity) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
}

PlanCache::PlanCache(size_t capacity) : capacity_(capacity) {}

absl::StatusOr<std::shared_ptr<const SavePlan>> PlanCache::GetSavePlan(
    absl::Span<const TensorPiece> pieces, int64_t num_ranks, const SavePlanOptions& options) {
  const PlanKey key = SavePlanKey(pieces, num_ranks, options);
  if (auto plan = save_.Find(key)) {
    ++hits_;
    return plan;
  }
  ++misses_;
  absl::StatusOr<SavePlan> built = BuildSavePlan(pieces, num_ranks, options);
  if (!built.ok()) return built.status();
  auto plan = std::make_shared<const SavePlan>(std::move(*built));
  save_.Insert(key, plan, capacity_);
  return plan;
}

absl::StatusOr<std::shared_ptr<const LoadPlan>> PlanCache::GetLoadPlan(
    absl::Span<const TensorMeta> tensors, absl::Span<const StoredPieceInfo> pieces,
    absl::Span<const LoadRequest> requests, int64_t num_ranks, const LoadPlanOptions& options) {
  const PlanKey key = LoadPlanKey(tensors, pieces, requests, num_ranks, options);
  if (auto plan = load_.Find(key)) {
    ++hits_;
    return plan;
  }
  ++misses_;
  absl::StatusOr<LoadPlan> built = BuildLoadPlan(tensors, pieces, requests, num_ranks, options);
  if (!built.ok()) return built.status();
  auto plan = std::make_shared<const LoadPlan>(std::move(*built));
  load_.Insert(key, plan, capacity_);
  return plan;
}

}  // namespace ckpt
