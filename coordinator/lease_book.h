// Lease renewals of live workers, apart from the coordinator service's lock. A heartbeat of a
// worker the book knows as live is recorded here under the book's own mutex, so it never
// waits for whatever holds the service's state (status answers, plan bookkeeping, commits,
// finalizers); the service folds the renewals into its WorkerRegistry before it checks leases.
// Workers the book does not know (unknown, dead, another certificate's) are answered by the
// service under its lock, with the registry's own errors.
//
// The book also keeps the coordinator's heartbeat lag: how long heartbeats waited in the
// coordinator's own queues before their handler ran (HeartbeatRequest.timeout_ms). When the
// coordinator is overloaded (40k simulated ranks on 2 cores answered heartbeats more than 5 s
// late), a lease counted without it would declare live workers lost for the coordinator's delay.
#ifndef CKPT_COORDINATOR_LEASE_BOOK_H_
#define CKPT_COORDINATOR_LEASE_BOOK_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::coordinator {

// See the file comment. Thread-safe.
class LeaseBook {
 public:
  // A worker (re)registered and is live: `principal` is the one of the certificate that
  // registered it (empty on a plaintext server).
  void Add(absl::string_view worker_id, absl::string_view principal);
  // The worker died or left: its renewals go through the registry again.
  void Remove(absl::string_view worker_id);
  // Records a renewal of `worker_id` by `principal` (nullptr: an unauthenticated caller).
  // False, recording nothing, when the worker is not live in the book or registered with
  // another certificate: the caller answers through the registry instead.
  bool Renew(absl::string_view worker_id, const std::string* principal);
  // The workers renewed since the last call, each once.
  std::vector<std::string> TakeRenewals();

  // Notes that a heartbeat handled at `now` had waited `lag` before its handler ran. Lags are
  // kept per window of `window` (the lease): the current window's largest and the last one's.
  void NoteLag(absl::Duration lag, absl::Time now, absl::Duration window);
  // The largest lag noted in the window holding `now` and the one before it (zero when none),
  // at most `cap`.
  absl::Duration RecentLag(absl::Time now, absl::Duration window, absl::Duration cap);

 private:
  struct Entry {
    std::string principal;
    bool renewed = false;
  };
  std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> renewed_ ABSL_GUARDED_BY(mu_);
  int64_t lag_window_ ABSL_GUARDED_BY(mu_) = 0;       // index of the current window (now / window)
  absl::Duration lag_ ABSL_GUARDED_BY(mu_);           // largest lag of the current window
  absl::Duration previous_lag_ ABSL_GUARDED_BY(mu_);  // ... of the window before it
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_LEASE_BOOK_H_
