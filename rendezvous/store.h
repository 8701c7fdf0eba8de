// Rendezvous key-value store used by communicators to find each other (Gloo addresses, NCCL
// unique ids). Every call takes a deadline; nothing blocks past it.
#ifndef CKPT_RENDEZVOUS_STORE_H_
#define CKPT_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rendezvous/kv_store.h"

namespace ckpt {

// Abstract rendezvous store. Implementations are thread-safe.
class Store {
 public:
  virtual ~Store() = default;

  // Stores value under key (replacing any previous value).
  virtual absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) = 0;

  // Waits until every key exists, then returns the values in key order. DeadlineExceeded
  // (naming the missing keys) when they do not all appear by `deadline`.
  virtual absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                                       absl::Time deadline) = 0;

  // Adds delta to the integer at key (absent = 0); returns the new value.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta,
                                      absl::Time deadline) = 0;

  // Waits until every key exists.
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) {
    return Get(keys, deadline).status();
  }
};

// Store for ranks that are threads of one process (tests, single-host tools).
class InMemoryStore : public Store {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) override;

 private:
  KvStore kv_;
};

// Prepends "<prefix>/" to every key so that several groups can share one store.
class PrefixedStore : public Store {
 public:
  // `base` must outlive this object.
  PrefixedStore(std::string prefix, Store* base) : prefix_(std::move(prefix)), base_(base) {}

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) override;

 private:
  std::string Join(absl::string_view key) const;
  std::string prefix_;
  Store* base_;
};

// DeadlineExceeded "<where>: ranks [..] never arrived before the deadline", naming the ranks
// whose key (`keys[r]` for rank r) `group_store` still lacks: the diagnosis of a group step that
// waited for every rank's key and ran out of time.
absl::Status NeverArrivedError(Store& group_store, absl::Span<const std::string> keys,
                               absl::string_view where);

// Group formation step shared by backends: records that `rank` arrived (key
// "arrived/<rank>" in `group_store`) and waits for all `size` ranks. DeadlineExceeded lists the
// ranks that never arrived, prefixed with `where`.
absl::Status ArriveAndWait(Store& group_store, int rank, int size, absl::Time deadline,
                           absl::string_view where);

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_STORE_H_
