#include "rendezvous/store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace ckpt {

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value,
                                absl::Time /*deadline*/) {
  return kv_.Set(key, value);
}

absl::StatusOr<std::vector<std::string>> InMemoryStore::Get(absl::Span<const std::string> keys,
                                                            absl::Time deadline) {
  return kv_.WaitAndGet(keys, deadline);
}

absl::StatusOr<int64_t> InMemoryStore::Add(absl::string_view key, int64_t delta,
                                           absl::Time /*deadline*/) {
  return kv_.Add(key, delta);
}

std::string PrefixedStore::Join(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

absl::Status PrefixedStore::Set(absl::string_view key, absl::string_view value,
                                absl::Time deadline) {
  return base_->Set(Join(key), value, deadline);
}

absl::StatusOr<std::vector<std::string>> PrefixedStore::Get(absl::Span<const std::string> keys,
                                                            absl::Time deadline) {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const std::string& k : keys) joined.push_back(Join(k));
  return base_->Get(joined, deadline);
}

absl::StatusOr<int64_t> PrefixedStore::Add(absl::string_view key, int64_t delta,
                                           absl::Time deadline) {
  return base_->Add(Join(key), delta, deadline);
}

absl::Status ArriveAndWait(Store& group_store, int rank, int size, absl::Time deadline,
                           absl::string_view where) {
  absl::Status set = group_store.Set(absl::StrCat("arrived/", rank), "1", deadline);
  if (!set.ok()) return absl::Status(set.code(), absl::StrCat(where, ": ", set.message()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("arrived/", r));
  absl::Status arrived = group_store.Wait(keys, deadline);
  if (arrived.ok()) return arrived;
  if (arrived.code() != absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(arrived.code(), absl::StrCat(where, ": ", arrived.message()));
  }
  return NeverArrivedError(group_store, keys, where);
}

absl::Status NeverArrivedError(Store& group_store, absl::Span<const std::string> keys,
                               absl::string_view where) {
  std::vector<int> missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (!group_store.Get({keys[r]}, absl::Now()).ok()) missing.push_back(static_cast<int>(r));
  }
  return absl::DeadlineExceededError(absl::StrCat(where, ": ranks [", absl::StrJoin(missing, ", "),
                                                  "] never arrived before the deadline"));
}

}  // namespace ckpt
