#include "exchange/store.h"

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value,
                                absl::Time /*deadline*/) {
  kv_.Set(key, value);
  return absl::OkStatus();
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

}  // namespace ckpt
