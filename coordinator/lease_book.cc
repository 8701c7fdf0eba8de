#include "coordinator/lease_book.h"

#include <algorithm>
#include <utility>

namespace ckpt::coordinator {

void LeaseBook::Add(absl::string_view worker_id, absl::string_view principal) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[worker_id].principal = std::string(principal);
}

void LeaseBook::Remove(absl::string_view worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(worker_id);
  if (it == live_.end()) return;
  if (it->second.renewed) {
    renewed_.erase(std::find(renewed_.begin(), renewed_.end(), it->first));
  }
  live_.erase(it);
}

bool LeaseBook::Renew(absl::string_view worker_id, const std::string* principal) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(worker_id);
  if (it == live_.end()) return false;
  if (principal != nullptr && *principal != it->second.principal) return false;
  if (!it->second.renewed) {
    it->second.renewed = true;
    renewed_.push_back(it->first);
  }
  return true;
}

std::vector<std::string> LeaseBook::TakeRenewals() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : renewed_) {
    auto it = live_.find(id);
    if (it != live_.end()) it->second.renewed = false;
  }
  return std::exchange(renewed_, {});
}

}  // namespace ckpt::coordinator
