// Coalesces a worker's WaitOperation calls to the coordinator: while one call for a key (an
// operation under one registration) is in flight, further waits for the same key do not make
// their own call but take that call's result. Every trainer waiting on an operation used to
// hold its own WaitOperation call at the coordinator (8 per worker of 8 GPUs); the
// coordinator's cost per completion grows with its outstanding calls (docs/services.md), so
// one call per worker and operation is what the coordinator should see.
#ifndef CKPT_WORKER_COORDINATOR_WAITS_H_
#define CKPT_WORKER_COORDINATOR_WAITS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// One shared call per key at a time. Thread-safe. The call runs on the thread of the waiter
// that found no call in flight (the leader); the others (followers) block until it returns or
// their own deadline passes. A call's result, error or not, goes to the leader and to every
// follower that joined while it was in flight; a wait after it returned makes a new call.
class CoordinatorWaits {
 public:
  using Result = absl::StatusOr<pb::OperationStatus>;
  using Call = std::function<Result()>;
  // Called (with the key, under the helper's lock: it must not call back) when a wait joins a
  // call in flight. For tests, to order events without sleeping.
  using JoinObserver = std::function<void(const std::string& key)>;

  CoordinatorWaits() = default;
  explicit CoordinatorWaits(JoinObserver on_join) : on_join_(std::move(on_join)) {}

  // `call`'s result if no call for `key` is in flight (it runs on this thread), else the
  // result of the one in flight. nullopt when that one has not returned by `deadline` (the
  // shared call goes on for the others; the caller decides what to answer).
  std::optional<Result> Wait(const std::string& key, absl::Time deadline, const Call& call);

  // How many calls were made, and how many waits joined a call in flight (for tests).
  int64_t calls() const;
  int64_t joins() const;

 private:
  struct Flight {
    bool done = false;
    std::optional<Result> result;
  };

  const JoinObserver on_join_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t joins_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_COORDINATOR_WAITS_H_
