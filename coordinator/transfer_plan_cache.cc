#include "coordinator/transfer_plan_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/deterministic.h"
#include "proto/state_digest.h"

namespace ckpt::coordinator {

std::string ManifestLayoutDigest(const pb::Manifest& manifest) {
  pb::Manifest layout = manifest;
  for (pb::StoredPiece& piece : *layout.mutable_pieces()) {
    piece.clear_xxh3_64();
    piece.clear_block_xxh3();
  }
  layout.clear_step();
  layout.clear_user_metadata();
  layout.clear_created_unix_micros();
  layout.clear_writer_version();
  return RankStateDigestOfBytes(SerializeDeterministically(layout));
}

std::string TransferPlanKey(const std::string& layout_digest, const Operation& op,
                            const std::vector<std::string>& serving_workers, int algorithm,
                            int64_t budget) {
  std::string key = absl::StrCat(layout_digest.size(), ":", layout_digest, "|", op.world_size, "|",
                                 algorithm, "|", budget, "|");
  for (int r = 0; r < op.world_size && r < static_cast<int>(op.ranks.size()); ++r) {
    const std::string& digest = op.ranks[r].description_digest;
    if (digest.empty()) return "";
    absl::StrAppend(&key, digest.size(), ":", digest);
  }
  absl::StrAppend(&key, "|");
  for (const std::string& worker : serving_workers) {
    absl::StrAppend(&key, worker.size(), ":", worker);
  }
  return key;
}

std::optional<std::vector<RankPlan>> TransferPlanCache::Find(const std::string& key) {
  if (key.empty()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it == plans_.end()) return std::nullopt;
  recency_.remove(key);
  recency_.push_front(key);
  ++reused_;
  return it->second;
}

void TransferPlanCache::Keep(const std::string& key, std::vector<RankPlan> plans) {
  if (key.empty() || max_plans_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  plans_[key] = std::move(plans);
  recency_.remove(key);
  recency_.push_front(key);
  while (plans_.size() > max_plans_) {
    plans_.erase(recency_.back());
    recency_.pop_back();
  }
}

int64_t TransferPlanCache::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

size_t TransferPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace ckpt::coordinator
