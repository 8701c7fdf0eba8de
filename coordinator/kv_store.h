// The rendezvous key-value store's state: a thread-safe in-memory map with blocking waits.
// Served over gRPC by RendezvousService and used directly by in-process tests (InMemoryStore).
#ifndef CKPT_COORDINATOR_KV_STORE_H_
#define CKPT_COORDINATOR_KV_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt {

// Keys map to byte strings. Counters written by Add are stored as decimal text, so Get of a
// counter returns e.g. "3".
class KvStore {
 public:
  KvStore() = default;
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Stores (or replaces) the value and wakes waiters.
  void Set(absl::string_view key, absl::string_view value);

  // Waits until every key exists, then returns their values in the order of `keys`.
  // DeadlineExceeded names the keys still missing at `deadline`; Cancelled when `cancelled`
  // (polled at least every 50 ms) returns true first.
  absl::StatusOr<std::vector<std::string>> WaitAndGet(
      absl::Span<const std::string> keys, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr);

  // Atomically adds delta to the integer at key (absent = 0) and returns the new value.
  // InvalidArgument when the existing value is not a decimal integer or the sum overflows.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);

  // Removes every key starting with `prefix` (e.g. a finished operation's rendezvous keys,
  // "load/op-7/"); returns how many. Waiters on removed keys keep waiting.
  size_t ErasePrefix(absl::string_view prefix);

  // Number of keys (for tests and metrics).
  size_t size() const;

 private:
  bool AllPresentLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // std::mutex rather than absl::Mutex: ThreadSanitizer sees through it (docs/services.md).
  mutable std::mutex mu_;
  std::condition_variable_any changed_;  // notified when a key is set
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_COORDINATOR_KV_STORE_H_
