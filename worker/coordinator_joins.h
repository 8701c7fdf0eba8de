// Coalesces a worker's JoinOperation calls: while one JoinOperations call is in flight, the
// joins that arrive meanwhile queue, and go to the coordinator together in the next call; and
// a call about to go lingers (briefly, bounded) until every rank of the job that this worker
// serves has queued its join. A worker's trainers (8 on a node of 8 GPUs) join an operation
// at about the same time; at 100k ranks the coordinator's cost per call (gRPC, the kernel's
// sends) dominated the gather, so a worker should make one call for its ranks, not eight
// (issue 16).
#ifndef CKPT_WORKER_COORDINATOR_JOINS_H_
#define CKPT_WORKER_COORDINATOR_JOINS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// One JoinOperations call at a time; thread-safe. A join that finds no call in flight makes
// one (on its own thread, the leader) carrying every join queued by then, its own included,
// at most CoordinatorService::kMaxJoinsPerCall (4096); the others block until a call that
// carried them returns. Before it calls, the leader lingers until, for every job in the
// queue, as many joins are queued as the job has ranks on this worker (Options::peers, read
// when each join arrives), or Options::linger has passed: a rank that never joins delays the
// others by the linger at most. No join waits longer than two lingers and two calls, each
// call bounded by its own deadline (the Call's business). A call that fails fails every join
// it carried.
class CoordinatorJoins {
 public:
  using Result = absl::StatusOr<pb::JoinOperationResponse>;
  // One JoinOperations call to the coordinator.
  using Call =
      std::function<absl::StatusOr<pb::JoinOperationsResponse>(const pb::JoinOperationsRequest&)>;
  // How many ranks of `job` this worker serves (its open sessions of the job). Called without
  // the helper's lock held.
  using PeerCount = std::function<int(const std::string& job)>;
  // Called (under the helper's lock: it must not call back) when a join queues behind a call
  // in flight or a lingering leader. For tests, to order events without sleeping.
  using QueueObserver = std::function<void()>;

  static constexpr int kMaxJoinsPerCall = 4096;

  // Called (under the helper's lock) each time a leader goes on lingering, with the number of
  // joins queued. For tests.
  using LingerObserver = std::function<void(int queued)>;

  struct Options {
    PeerCount peers;                               // null: no linger
    absl::Duration linger = absl::ZeroDuration();  // the longest a call waits for peers
    QueueObserver on_queue;
    LingerObserver on_linger;
  };

  // No linger.
  explicit CoordinatorJoins(Call call) : call_(std::move(call)) {}
  CoordinatorJoins(Call call, Options options)
      : call_(std::move(call)), options_(std::move(options)) {}

  // The coordinator's answer to `join`, or the error that it or the call gave.
  Result Join(pb::JoinOperationRequest join);

  // How many JoinOperations calls were made (for tests and logs).
  int64_t calls() const;

 private:
  struct Pending {
    pb::JoinOperationRequest request;
    int peers = 1;  // the job's ranks on this worker when this join arrived
    std::optional<Result> result;
  };
  using Batch = std::vector<std::shared_ptr<Pending>>;

  // Whether every job in the queue has as many joins queued as it has ranks here.
  bool EveryPeerQueued() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lingers (the lock released while waiting) until EveryPeerQueued or the linger passed,
  // then sends the queued joins (the lock released meanwhile) and hands out their results.
  void RunCall(std::unique_lock<std::mutex>& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void HandOut(const Batch& batch,
                      const absl::StatusOr<pb::JoinOperationsResponse>& response);

  const Call call_;
  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_COORDINATOR_JOINS_H_
