#include "worker/operation_ends.h"

namespace ckpt::worker {
namespace {

// Remembers `key` in `order`, dropping the oldest keys of `map` beyond the bound.
template <typename Map>
void Remember(const std::string& key, Map& map, std::deque<std::string>& order) {
  order.push_back(key);
  while (order.size() > OperationEnds::kRemembered) {
    map.erase(order.front());
    order.pop_front();
  }
}

}  // namespace

void OperationEnds::StreamOpened() {
  std::lock_guard<std::mutex> lock(mu_);
  open_stream_ = ++streams_;
  changed_.notify_all();
}

void OperationEnds::StreamClosed() {
  std::lock_guard<std::mutex> lock(mu_);
  open_stream_ = 0;
  changed_.notify_all();
}

uint64_t OperationEnds::OpenStream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_stream_;
}

void OperationEnds::Joined(const std::string& operation_id, uint64_t stream) {
  if (stream == 0 || operation_id.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = joined_.try_emplace(operation_id, stream);
  if (!added) {
    // Joined again (another rank, a later call): the newest stream is what watches it now.
    it->second = std::max(it->second, stream);
    return;
  }
  Remember(operation_id, joined_, joined_order_);
}

void OperationEnds::Ended(const pb::OperationStatus& status, bool from_stream) {
  if (status.id().empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = ended_.try_emplace(status.id(), status);
  if (added) {
    if (from_stream) ++ends_from_stream_;
    Remember(status.id(), ended_, ended_order_);
  }
  changed_.notify_all();
}

int64_t OperationEnds::ends_from_stream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ends_from_stream_;
}

bool OperationEnds::WatchedLocked(const std::string& operation_id) const {
  auto it = joined_.find(operation_id);
  return open_stream_ != 0 && it != joined_.end() && it->second == open_stream_;
}

bool OperationEnds::KnownOngoing(const std::string& operation_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return WatchedLocked(operation_id) && !ended_.contains(operation_id);
}

OperationEnds::Outcome OperationEnds::Wait(const std::string& operation_id, absl::Time deadline,
                                           pb::OperationStatus* status) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, absl::ToChronoTime(deadline), [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return ended_.contains(operation_id) || !WatchedLocked(operation_id);
  });
  if (auto it = ended_.find(operation_id); it != ended_.end()) {
    *status = it->second;
    return Outcome::kEnded;
  }
  return WatchedLocked(operation_id) ? Outcome::kNotEndedBy : Outcome::kNotWatched;
}

}  // namespace ckpt::worker
