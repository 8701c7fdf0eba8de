#include "coordinator/kv_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

void KvStore::Set(absl::string_view key, absl::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  values_[key] = std::string(value);
  changed_.notify_all();
}

bool KvStore::AllPresentLocked(absl::Span<const std::string> keys) const {
  for (const std::string& key : keys) {
    if (!values_.contains(key)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> KvStore::WaitAndGet(
    absl::Span<const std::string> keys, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);
  std::lock_guard<std::mutex> lock(mu_);
  while (!AllPresentLocked(keys)) {
    if (cancelled && cancelled()) {
      return absl::CancelledError("wait for rendezvous keys cancelled by the caller");
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (const std::string& key : keys) {
        if (!values_.contains(key)) missing.push_back(key);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous keys still missing at the deadline: ", absl::StrJoin(missing, ", ")));
    }
    // Bounded, so that an infinite deadline never reaches the clock arithmetic of wait_until.
    absl::Time wake = std::min(deadline, now + (cancelled ? kCancelPoll : absl::Hours(1)));
    changed_.wait_until(mu_, absl::ToChronoTime(wake));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(values_.at(key));
  return out;
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t current = 0;
  auto it = values_.find(key);
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous key '", key, "' holds a non-integer value; cannot Add"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous counter '", key, "' overflows: ", current, " + ", delta));
  }
  values_[key] = absl::StrCat(sum);
  changed_.notify_all();
  return sum;
}

size_t KvStore::ErasePrefix(absl::string_view prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t erased = 0;
  for (auto it = values_.begin(); it != values_.end();) {
    if (absl::StartsWith(it->first, prefix)) {
      values_.erase(it++);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

size_t KvStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace ckpt
