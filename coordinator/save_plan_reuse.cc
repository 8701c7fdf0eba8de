#include "coordinator/save_plan_reuse.h"

#include <utility>

#include "coordinator/group_plan.h"

namespace ckpt::coordinator {
namespace {

constexpr int kStagingDirField = 4;    // pb::SavePlanPart.staging_dir
constexpr int kCompressionField = 15;  // pb::SavePlanPart.compression

// Field `field` (length-delimited) holding `value`, serialized: appended to a serialized
// message it replaces a singular string field (the last occurrence wins when parsed).
std::string StringField(int field, const std::string& value) {
  std::string out(1, static_cast<char>((field << 3) | 2));
  uint64_t n = value.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7F) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  return out + value;
}

bool EveryRankHasADigest(const Operation& op) {
  for (const RankEntry& rank : op.ranks) {
    if (rank.description_digest.empty()) return false;
  }
  return !op.ranks.empty();
}

}  // namespace

std::optional<std::vector<RankPlan>> SavePlanReuse::Find(const Operation& op,
                                                         const std::string& staging_dir) {
  if (!EveryRankHasADigest(op)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(op.job);
  if (it == jobs_.end() || it->second.digests.size() != op.ranks.size() ||
      it->second.groups != SaveGroupsKey(op)) {
    return std::nullopt;
  }
  for (size_t r = 0; r < op.ranks.size(); ++r) {
    if (it->second.digests[r] != op.ranks[r].description_digest) return std::nullopt;
  }
  recency_.splice(recency_.begin(), recency_, it->second.recency);
  const auto staging =
      std::make_shared<const std::string>(StringField(kStagingDirField, staging_dir));
  const Kept& kept = it->second;
  std::vector<RankPlan> plans(kept.parts.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    plans[r].part = kept.parts[r].WithTail(staging);
    plans[r].bytes = kept.part_bytes[r];
    plans[r].reused = true;
  }
  ++reused_;
  return plans;
}

void SavePlanReuse::Keep(const Operation& op, std::vector<RankPlan>* plans_out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto old = jobs_.find(op.job);
  if (old != jobs_.end()) DropLocked(old);
  if (!EveryRankHasADigest(op) || plans_out->size() != op.ranks.size()) return;
  const std::vector<RankPlan>& plans = *plans_out;
  Kept kept;
  for (const RankEntry& rank : op.ranks) kept.digests.push_back(rank.description_digest);
  kept.groups = SaveGroupsKey(op);
  kept.parts.reserve(plans.size());
  kept.part_bytes.reserve(plans.size());
  for (const RankPlan& plan : plans) {
    kept.parts.push_back(plan.part);
    kept.part_bytes.push_back(plan.bytes);
    kept.bytes += static_cast<int64_t>(plan.part.size()) + 32;
  }
  while (bytes_ + kept.bytes > max_bytes_ && !recency_.empty()) {
    DropLocked(jobs_.find(recency_.back()));
  }
  if (kept.bytes > max_bytes_) return;
  const auto body_id = std::make_shared<const std::string>(op.id);
  for (size_t r = 0; r < plans.size(); ++r) {
    kept.parts[r] = kept.parts[r].WithBodyId(body_id);
    (*plans_out)[r].part = kept.parts[r];
  }
  recency_.push_front(op.job);
  kept.recency = recency_.begin();
  bytes_ += kept.bytes;
  jobs_.emplace(op.job, std::move(kept));
}

void AddCompressionTail(const std::string& spec, std::vector<RankPlan>* plans) {
  if (spec.empty()) return;
  const auto tail = std::make_shared<const std::string>(StringField(kCompressionField, spec));
  for (RankPlan& plan : *plans) plan.part = plan.part.WithTail(tail);
}

int64_t SavePlanReuse::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

void SavePlanReuse::DropLocked(std::map<std::string, Kept>::iterator it) {
  bytes_ -= it->second.bytes;
  recency_.erase(it->second.recency);
  jobs_.erase(it);
}

}  // namespace ckpt::coordinator
