#include "worker/kept_plan_parts.h"

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

std::string KeptPlanParts::Held(const std::string& job, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = bodies_.find({job, rank});
  return it == bodies_.end() ? "" : it->second.id;
}

absl::Status KeptPlanParts::Resolve(pb::WorkItem& item) {
  if (item.plan_part_body_id().empty()) return absl::OkStatus();
  const Key key(item.job(), item.rank());
  std::lock_guard<std::mutex> lock(mu_);
  if (item.plan_part_by_reference()) {
    auto it = bodies_.find(key);
    if (it == bodies_.end() || it->second.id != item.plan_part_body_id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", item.job(), " rank ", item.rank(), ": the coordinator sent the plan part of ",
          item.operation_id(), " by reference to body ", item.plan_part_body_id(),
          ", which this worker does not keep (it keeps ",
          it == bodies_.end() ? "none" : it->second.id, "); save again"));
    }
    item.set_plan_part(it->second.bytes + item.plan_part());
    return absl::OkStatus();
  }
  const int64_t size = item.plan_part_body_size();
  if (size < 0 || static_cast<size_t>(size) > item.plan_part().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", item.job(), " rank ", item.rank(), ": plan part of ", item.operation_id(),
        " names a body of ", size, " bytes in a part of ", item.plan_part().size()));
  }
  auto [it, inserted] = bodies_.try_emplace(key);
  it->second = Body{item.plan_part_body_id(), item.plan_part().substr(0, size)};
  if (inserted) {
    order_.push_back(key);
    while (bodies_.size() > max_bodies_ && !order_.empty()) {
      bodies_.erase(order_.front());
      order_.pop_front();
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
