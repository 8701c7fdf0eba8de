// The rendezvous key-value store's state: a thread-safe in-memory map with blocking waits
// (WaitAndGet) and waits that hold no thread (WaitAsync, for the gRPC callback service).
// Served over gRPC by RendezvousService and used directly by in-process tests (InMemoryStore).
#ifndef CKPT_RENDEZVOUS_KV_STORE_H_
#define CKPT_RENDEZVOUS_KV_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
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

// Bounds on what one group of keys may hold (a group is one operation's rendezvous, and a
// job runs one operation at a time), so that no caller can grow the store without limit.
struct KvLimits {
  size_t max_keys_per_group = 65536;
  size_t max_value_bytes = size_t{8} << 20;      // a Gloo address list of ~40k ranks
  size_t max_bytes_per_group = size_t{1} << 30;  // keys + values
  size_t max_key_bytes = 1024;
};

// The group of a key: its first two '/'-separated components ("load/op-7" for
// "load/op-7/mesh/rank_0"); keys with fewer components belong to the group "".
absl::string_view KvGroupOf(absl::string_view key);

// Keys map to byte strings. Counters written by Add are stored as decimal text, so Get of a
// counter returns e.g. "3".
class KvStore {
 public:
  explicit KvStore(KvLimits limits = KvLimits()) : limits_(limits) {}
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Stores (or replaces) the value and wakes waiters. ResourceExhausted, naming the group and
  // the limit, when the key, the value or the key's group would exceed the limits.
  absl::Status Set(absl::string_view key, absl::string_view value);

  // Waits until every key exists, then returns their values in the order of `keys`.
  // DeadlineExceeded names the keys still missing at `deadline`; Cancelled when `cancelled`
  // (polled at least every 50 ms) returns true first.
  absl::StatusOr<std::vector<std::string>> WaitAndGet(
      absl::Span<const std::string> keys, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr);

  // What a WaitAsync ends with: the values in the order of the keys, or why not.
  using WaitCallback = std::function<void(absl::StatusOr<std::vector<std::string>>)>;

  // Waits for every key to exist without holding a thread: `done` runs exactly once, without
  // the store's lock, on the thread that ends the wait: with the values (at once, inside this
  // call, when they all exist already; else inside the Set or Add that completes them),
  // DeadlineExceeded naming the keys still missing (inside ExpireWaits at or past `deadline`),
  // or Cancelled (inside CancelWait). Returns the wait's id for CancelWait.
  uint64_t WaitAsync(std::vector<std::string> keys, absl::Time deadline, WaitCallback done);
  // Ends wait `id` with Cancelled when it is still waiting; else does nothing.
  void CancelWait(uint64_t id);
  // Ends the waits whose deadline is at or before `now` with DeadlineExceeded. Returns the
  // earliest deadline still waited for (InfiniteFuture when none).
  absl::Time ExpireWaits(absl::Time now);
  // Number of WaitAsync waits still waiting (for tests and metrics).
  size_t async_waits() const;

  // Atomically adds delta to the integer at key (absent = 0) and returns the new value.
  // InvalidArgument when the existing value is not a decimal integer or the sum overflows;
  // ResourceExhausted as Set for a new key.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);

  // Removes every key starting with `prefix` (e.g. a finished operation's rendezvous keys,
  // "load/op-7/"); returns how many. Waiters on removed keys keep waiting.
  size_t ErasePrefix(absl::string_view prefix);

  // Number of keys (for tests and metrics).
  size_t size() const;
  // Bytes (keys + values) held in all groups.
  size_t bytes() const;

 private:
  struct GroupUsage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  // One WaitAsync in progress, indexed under the first key it still misses.
  struct AsyncWait {
    std::vector<std::string> keys;
    absl::Time deadline;
    WaitCallback done;
  };
  // A finished wait's callback and its outcome, run once the lock is released.
  using Completion = std::pair<WaitCallback, absl::StatusOr<std::vector<std::string>>>;

  bool AllPresentLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first of `keys` that does not exist; nullptr when all do.
  const std::string* FirstMissingLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> ValuesLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores value at key if the limits allow it, keeping the groups' usage; the async waits it
  // completes are appended to *ready.
  absl::Status PutLocked(absl::string_view key, std::string value, std::vector<Completion>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-indexes the waits that were waiting on `key` (just set); completed ones go to *ready.
  void AdvanceWaitsLocked(const std::string& key, std::vector<Completion>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(std::vector<Completion> ready);

  const KvLimits limits_;
  // std::mutex rather than absl::Mutex: ThreadSanitizer sees through it (docs/services.md).
  mutable std::mutex mu_;
  std::condition_variable_any changed_;  // notified when a key is set
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, GroupUsage> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, AsyncWait> async_waits_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, uint64_t> waiting_on_ ABSL_GUARDED_BY(mu_);  // missing key -> wait
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_KV_STORE_H_
