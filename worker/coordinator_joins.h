// Coalesces a worker's JoinOperation calls: while one JoinOperations call is in flight, the
// joins that arrive meanwhile queue, and go to the coordinator together in the next call.
// A worker's trainers (8 on a node of 8 GPUs) join an operation at about the same time; at
// 100k ranks the coordinator's cost per call (gRPC, the kernel's sends) dominated the gather,
// so a worker should make two calls for its ranks, not eight (issue 16).
#ifndef CKPT_WORKER_COORDINATOR_JOINS_H_
#define CKPT_WORKER_COORDINATOR_JOINS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// One JoinOperations call at a time; thread-safe. A join that finds no call in flight makes
// one (on its own thread, the leader) carrying every join queued by then, its own included,
// at most CoordinatorService::kMaxJoinsPerCall (4096); the others block until a call that
// carried them returns. No join waits longer than two calls, each bounded by the call's own
// deadline (the Call's business). A call that fails fails every join it carried.
class CoordinatorJoins {
 public:
  using Result = absl::StatusOr<pb::JoinOperationResponse>;
  // One JoinOperations call to the coordinator.
  using Call =
      std::function<absl::StatusOr<pb::JoinOperationsResponse>(const pb::JoinOperationsRequest&)>;
  // Called (under the helper's lock: it must not call back) when a join queues behind a call
  // in flight. For tests, to order events without sleeping.
  using QueueObserver = std::function<void()>;

  static constexpr int kMaxJoinsPerCall = 4096;

  explicit CoordinatorJoins(Call call, QueueObserver on_queue = nullptr)
      : call_(std::move(call)), on_queue_(std::move(on_queue)) {}

  // The coordinator's answer to `join`, or the error that it or the call gave.
  Result Join(pb::JoinOperationRequest join);

  // How many JoinOperations calls were made (for tests and logs).
  int64_t calls() const;

 private:
  struct Pending {
    pb::JoinOperationRequest request;
    std::optional<Result> result;
  };
  using Batch = std::vector<std::shared_ptr<Pending>>;

  // Sends the queued joins (the lock released meanwhile) and hands out their results.
  void RunCall(std::unique_lock<std::mutex>& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void HandOut(const Batch& batch,
                      const absl::StatusOr<pb::JoinOperationsResponse>& response);

  const Call call_;
  const QueueObserver on_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_COORDINATOR_JOINS_H_
