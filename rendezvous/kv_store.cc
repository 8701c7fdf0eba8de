#include "rendezvous/kv_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

absl::string_view KvGroupOf(absl::string_view key) {
  size_t first = key.find('/');
  if (first == absl::string_view::npos) return "";
  size_t second = key.find('/', first + 1);
  if (second == absl::string_view::npos) return "";
  return key.substr(0, second);
}

absl::Status KvStore::PutLocked(absl::string_view key, std::string value) {
  if (key.size() > limits_.max_key_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous key of ", key.size(), " bytes; the limit is ", limits_.max_key_bytes));
  }
  const std::string group(KvGroupOf(key));
  if (value.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous value of '", key, "' is ", value.size(), " bytes; the limit is ",
                     limits_.max_value_bytes, " (--rendezvous_max_value_bytes)"));
  }
  auto existing = values_.find(key);
  GroupUsage usage = groups_[group];
  if (existing == values_.end()) {
    usage.keys += 1;
    usage.bytes += key.size() + value.size();
  } else {
    usage.bytes = usage.bytes - existing->second.size() + value.size();
  }
  absl::Status refused;
  if (usage.keys > limits_.max_keys_per_group) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous group '", group, "' holds ", usage.keys - 1, " keys; the limit is ",
        limits_.max_keys_per_group, " (--rendezvous_max_keys_per_job)"));
  } else if (usage.bytes > limits_.max_bytes_per_group) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous group '", group, "' would hold ", usage.bytes, " bytes; the limit is ",
        limits_.max_bytes_per_group, " (--rendezvous_max_bytes_per_job)"));
  }
  if (!refused.ok()) {
    if (groups_[group].keys == 0) groups_.erase(group);
    return refused;
  }
  groups_[group] = usage;
  if (existing == values_.end()) {
    values_.emplace(std::string(key), std::move(value));
  } else {
    existing->second = std::move(value);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  return PutLocked(key, std::string(value));
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
  if (absl::Status s = PutLocked(key, absl::StrCat(sum)); !s.ok()) return s;
  return sum;
}

size_t KvStore::ErasePrefix(absl::string_view prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t erased = 0;
  for (auto it = values_.begin(); it != values_.end();) {
    if (absl::StartsWith(it->first, prefix)) {
      auto group = groups_.find(KvGroupOf(it->first));
      if (group != groups_.end()) {
        group->second.keys -= 1;
        group->second.bytes -= it->first.size() + it->second.size();
        if (group->second.keys == 0) groups_.erase(group);
      }
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

size_t KvStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [group, usage] : groups_) total += usage.bytes;
  return total;
}

}  // namespace ckpt
