#include "rendezvous/kv_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

// Removes wait `id` from the index of missing keys. The caller holds the store's lock.
void Unindex(std::multimap<std::string, uint64_t>* waiting_on, const std::string& key,
             uint64_t id) {
  auto [first, last] = waiting_on->equal_range(key);
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      waiting_on->erase(it);
      return;
    }
  }
}

}  // namespace

absl::string_view KvGroupOf(absl::string_view key) {
  size_t first = key.find('/');
  if (first == absl::string_view::npos) return "";
  size_t second = key.find('/', first + 1);
  if (second == absl::string_view::npos) return "";
  return key.substr(0, second);
}

absl::Status KvStore::PutLocked(absl::string_view key, std::string value,
                                std::vector<Completion>* ready) {
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
  AdvanceWaitsLocked(std::string(key), ready);
  return absl::OkStatus();
}

absl::Status KvStore::Set(absl::string_view key, absl::string_view value) {
  std::vector<Completion> ready;
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = PutLocked(key, std::string(value), &ready);
  }
  Run(std::move(ready));
  return s;
}

void KvStore::Run(std::vector<Completion> ready) {
  for (auto& [done, outcome] : ready) done(std::move(outcome));
}

const std::string* KvStore::FirstMissingLocked(absl::Span<const std::string> keys) const {
  for (const std::string& key : keys) {
    if (!values_.contains(key)) return &key;
  }
  return nullptr;
}

std::vector<std::string> KvStore::ValuesLocked(absl::Span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(values_.at(key));
  return out;
}

void KvStore::AdvanceWaitsLocked(const std::string& key, std::vector<Completion>* ready) {
  auto [first, last] = waiting_on_.equal_range(key);
  std::vector<uint64_t> ids;
  for (auto it = first; it != last; ++it) ids.push_back(it->second);
  waiting_on_.erase(first, last);
  for (uint64_t id : ids) {
    AsyncWait& wait = async_waits_.at(id);
    if (const std::string* missing = FirstMissingLocked(wait.keys); missing != nullptr) {
      waiting_on_.emplace(*missing, id);
      continue;
    }
    ready->emplace_back(std::move(wait.done), ValuesLocked(wait.keys));
    async_waits_.erase(id);
  }
}

uint64_t KvStore::WaitAsync(std::vector<std::string> keys, absl::Time deadline, WaitCallback done) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t id = next_wait_id_++;
  if (const std::string* missing = FirstMissingLocked(keys); missing != nullptr) {
    waiting_on_.emplace(*missing, id);
    async_waits_.emplace(id, AsyncWait{std::move(keys), deadline, std::move(done)});
    return id;
  }
  std::vector<std::string> values = ValuesLocked(keys);
  lock.unlock();
  done(std::move(values));
  return id;
}

void KvStore::CancelWait(uint64_t id) {
  WaitCallback done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = async_waits_.find(id);
    if (it == async_waits_.end()) return;
    Unindex(&waiting_on_, *FirstMissingLocked(it->second.keys), id);
    done = std::move(it->second.done);
    async_waits_.erase(it);
  }
  done(absl::CancelledError("wait for rendezvous keys cancelled by the caller"));
}

absl::Time KvStore::ExpireWaits(absl::Time now) {
  std::vector<Completion> expired;
  absl::Time earliest = absl::InfiniteFuture();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = async_waits_.begin(); it != async_waits_.end();) {
      AsyncWait& wait = it->second;
      if (wait.deadline > now) {
        earliest = std::min(earliest, wait.deadline);
        ++it;
        continue;
      }
      std::vector<std::string> missing;
      for (const std::string& key : wait.keys) {
        if (!values_.contains(key)) missing.push_back(key);
      }
      Unindex(&waiting_on_, missing.front(), it->first);
      expired.emplace_back(
          std::move(wait.done),
          absl::DeadlineExceededError(absl::StrCat(
              "rendezvous keys still missing at the deadline: ", absl::StrJoin(missing, ", "))));
      it = async_waits_.erase(it);
    }
  }
  Run(std::move(expired));
  return earliest;
}

size_t KvStore::async_waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return async_waits_.size();
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
  std::unique_lock<std::mutex> lock(mu_);
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
  std::vector<Completion> ready;
  if (absl::Status s = PutLocked(key, absl::StrCat(sum), &ready); !s.ok()) return s;
  lock.unlock();
  Run(std::move(ready));
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
