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

namespace {

int64_t WindowIndex(absl::Time now, absl::Duration window) {
  absl::Duration remainder;  // IDivDuration writes it (null is not allowed)
  return absl::IDivDuration(now - absl::UnixEpoch(), std::max(window, absl::Milliseconds(1)),
                            &remainder);
}

}  // namespace

void LeaseBook::NoteLag(absl::Duration lag, absl::Time now, absl::Duration window) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t index = WindowIndex(now, window);
  if (index != lag_window_) {
    previous_lag_ = index == lag_window_ + 1 ? lag_ : absl::ZeroDuration();
    lag_ = absl::ZeroDuration();
    lag_window_ = index;
  }
  lag_ = std::max(lag_, lag);
}

absl::Duration LeaseBook::RecentLag(absl::Time now, absl::Duration window, absl::Duration cap) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t index = WindowIndex(now, window);
  absl::Duration recent = absl::ZeroDuration();
  if (index == lag_window_) recent = std::max(lag_, previous_lag_);
  if (index == lag_window_ + 1) recent = lag_;
  return std::min(recent, cap);
}

}  // namespace ckpt::coordinator
