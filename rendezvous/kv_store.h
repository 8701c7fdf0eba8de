// The rendezvous key-value store's state: a thread-safe in-memory map with blocking waits.
// Served over gRPC by RendezvousService and used directly by in-process tests (InMemoryStore).
#ifndef CKPT_RENDEZVOUS_KV_STORE_H_
#define CKPT_RENDEZVOUS_KV_STORE_H_

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
  bool AllPresentLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores value at key if the limits allow it, keeping the groups' usage.
  absl::Status PutLocked(absl::string_view key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLimits limits_;
  // std::mutex rather than absl::Mutex: ThreadSanitizer sees through it (docs/services.md).
  mutable std::mutex mu_;
  std::condition_variable_any changed_;  // notified when a key is set
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, GroupUsage> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_KV_STORE_H_
