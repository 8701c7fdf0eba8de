#include "worker/coordinator_waits.h"

#include <utility>

namespace ckpt::worker {

std::optional<CoordinatorWaits::Result> CoordinatorWaits::Wait(const std::string& key,
                                                               absl::Time deadline,
                                                               const Call& call) {
  std::unique_lock<std::mutex> lock(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
    std::shared_ptr<Flight> flight = it->second;
    ++joins_;
    if (on_join_) on_join_(key);
    cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return flight->done; });
    if (!flight->done) return std::nullopt;
    return flight->result;
  }
  auto flight = std::make_shared<Flight>();
  flights_[key] = flight;
  ++calls_;
  lock.unlock();
  Result result = call();
  lock.lock();
  flight->result = result;
  flight->done = true;
  flights_.erase(key);  // still this flight: only its leader removes it
  cv_.notify_all();
  return result;
}

int64_t CoordinatorWaits::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

int64_t CoordinatorWaits::joins() const {
  std::lock_guard<std::mutex> lock(mu_);
  return joins_;
}

}  // namespace ckpt::worker
