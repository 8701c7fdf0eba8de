#include "worker/coordinator_joins.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/status_detail.h"

namespace ckpt::worker {

CoordinatorJoins::Result CoordinatorJoins::Join(pb::JoinOperationRequest join) {
  auto me = std::make_shared<Pending>();
  me->request = std::move(join);
  if (options_.peers) me->peers = options_.peers(me->request.job());
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(me);
  if (in_flight_) {
    if (options_.on_queue) options_.on_queue();
    cv_.notify_all();  // a lingering leader counts its peers again
  }
  while (!me->result.has_value()) {
    if (!in_flight_) {
      RunCall(lock);  // `me` is still queued: a call that carried it would have answered it
    } else {
      cv_.wait(lock);
    }
  }
  return *std::move(me->result);
}

bool CoordinatorJoins::EveryPeerQueued() const {
  absl::flat_hash_map<absl::string_view, std::pair<int, int>> by_job;  // (queued, peers)
  for (const std::shared_ptr<Pending>& p : queue_) {
    auto& [queued, peers] = by_job[p->request.job()];
    ++queued;
    peers = std::max(peers, p->peers);
  }
  for (const auto& [job, counts] : by_job) {
    if (counts.first < counts.second) return false;
  }
  return true;
}

void CoordinatorJoins::RunCall(std::unique_lock<std::mutex>& lock) {
  in_flight_ = true;  // from here on, joins queue for this call
  if (options_.linger > absl::ZeroDuration()) {
    const auto deadline = absl::ToChronoTime(absl::Now() + options_.linger);
    while (static_cast<int>(queue_.size()) < kMaxJoinsPerCall && !EveryPeerQueued()) {
      if (options_.on_linger) options_.on_linger(static_cast<int>(queue_.size()));
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
  }
  Batch batch;
  pb::JoinOperationsRequest request;
  while (!queue_.empty() && static_cast<int>(batch.size()) < kMaxJoinsPerCall) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    *request.add_joins() = batch.back()->request;
  }
  ++calls_;
  lock.unlock();
  const absl::StatusOr<pb::JoinOperationsResponse> response = call_(request);
  lock.lock();
  HandOut(batch, response);
  in_flight_ = false;
  cv_.notify_all();
}

void CoordinatorJoins::HandOut(const Batch& batch,
                               const absl::StatusOr<pb::JoinOperationsResponse>& response) {
  absl::Status whole = response.status();
  if (whole.ok() && response->results_size() != static_cast<int>(batch.size())) {
    whole = absl::InternalError(absl::StrCat("the coordinator answered ", response->results_size(),
                                             " results to ", batch.size(), " joins"));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!whole.ok()) {
      batch[i]->result = whole;
      continue;
    }
    const pb::JoinResult& result = response->results(static_cast<int>(i));
    if (absl::Status refused = FromDetail(result.status()); !refused.ok()) {
      batch[i]->result = std::move(refused);
    } else {
      batch[i]->result = result.response();
    }
  }
}

int64_t CoordinatorJoins::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

}  // namespace ckpt::worker
