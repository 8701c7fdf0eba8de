// Lease renewals of live workers, apart from the coordinator service's lock. A heartbeat of a
// worker the book knows as live is recorded here under the book's own mutex, so it never
// waits for whatever holds the service's state (status answers, plan bookkeeping, commits,
// finalizers); the service folds the renewals into its WorkerRegistry before it checks leases.
// Workers the book does not know (unknown, dead, another certificate's) are answered by the
// service under its lock, with the registry's own errors.
#ifndef CKPT_COORDINATOR_LEASE_BOOK_H_
#define CKPT_COORDINATOR_LEASE_BOOK_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

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

 private:
  struct Entry {
    std::string principal;
    bool renewed = false;
  };
  std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> renewed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_LEASE_BOOK_H_
