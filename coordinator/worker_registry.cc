#include "coordinator/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt::coordinator {

uint64_t WorkerRegistry::WorkerNumber(absl::string_view id) const {
  uint64_t n = 0;
  if (!absl::ConsumePrefix(&id, "w-")) return 0;
  if (!incarnation_.empty() &&
      !(absl::ConsumePrefix(&id, incarnation_) && absl::ConsumePrefix(&id, "-"))) {
    return 0;
  }
  if (!absl::SimpleAtoi(id, &n)) return 0;
  return n;
}

std::string WorkerRecord::DebugString() const {
  return absl::StrCat("worker ", id, " (host ", description.host, ", pid ", description.pid, ")");
}

WorkerRegistry::WorkerRegistry(const Clock* clock, absl::Duration lease,
                               absl::Duration dead_retention, std::string incarnation,
                               int64_t max_dead)
    : clock_(clock),
      lease_(lease),
      dead_retention_(dead_retention),
      incarnation_(std::move(incarnation)),
      max_dead_(max_dead) {}

const WorkerRecord* WorkerRegistry::FindRegistered(const WorkerDescription& description) const {
  for (const auto& [number, record] : workers_) {
    if (record.description.host == description.host && record.description.pid == description.pid) {
      return &record;
    }
  }
  return nullptr;
}

absl::StatusOr<WorkerRecord> WorkerRegistry::Register(const WorkerDescription& description) {
  if (description.host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker registration without a host name (pid ", description.pid, ")"));
  }
  if (description.pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker registration from host ",
                                                   description.host, " has pid ", description.pid,
                                                   "; it must be positive"));
  }
  absl::Time now = clock_->Now();
  for (auto& [number, record] : workers_) {
    if (record.description.host == description.host && record.description.pid == description.pid) {
      record.description = description;
      record.last_heartbeat = now;
      record.lease_expiry = now + lease_;
      dead_ -= record.alive ? 0 : 1;
      record.alive = true;
      record.death_cause.clear();
      return record;
    }
  }
  uint64_t number = next_id_++;
  WorkerRecord record;
  record.id = incarnation_.empty() ? absl::StrCat("w-", number)
                                   : absl::StrCat("w-", incarnation_, "-", number);
  record.description = description;
  record.registered = now;
  record.last_heartbeat = now;
  record.lease_expiry = now + lease_;
  return workers_.emplace(number, std::move(record)).first->second;
}

absl::Status WorkerRegistry::Heartbeat(absl::string_view worker_id) {
  auto it = workers_.find(WorkerNumber(worker_id));
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered with this coordinator",
                     incarnation_.empty() ? "" : absl::StrCat(" (incarnation ", incarnation_, ")"),
                     "; register again"));
  }
  WorkerRecord& record = it->second;
  if (!record.alive) {
    return absl::FailedPreconditionError(absl::StrCat(record.DebugString(), " was declared dead (",
                                                      record.death_cause, "); register again"));
  }
  absl::Time now = clock_->Now();
  record.last_heartbeat = now;
  record.lease_expiry = now + lease_;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Deregister(absl::string_view worker_id) {
  auto it = workers_.find(WorkerNumber(worker_id));
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered"));
  }
  dead_ -= it->second.alive ? 0 : 1;
  workers_.erase(it);
  return absl::OkStatus();
}

std::vector<WorkerRecord> WorkerRegistry::Tick(absl::Duration grace) {
  absl::Time now = clock_->Now();
  std::vector<WorkerRecord> expired;
  for (auto it = workers_.begin(); it != workers_.end();) {
    WorkerRecord& record = it->second;
    if (record.alive && now >= record.lease_expiry + grace) {
      record.alive = false;
      record.death_cause = absl::StrCat(
          "missed its lease of ", absl::FormatDuration(lease_), " (last heartbeat ",
          absl::FormatDuration(absl::Trunc(now - record.last_heartbeat, absl::Milliseconds(1))),
          " ago",
          grace > absl::ZeroDuration()
              ? absl::StrCat(", after ", absl::FormatDuration(grace),
                             " more for the coordinator's own heartbeat lag")
              : "",
          ")");
      expired.push_back(record);
      ++dead_;
    }
    if (!record.alive && now - record.lease_expiry >= dead_retention_) {
      --dead_;
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  if (dead_ > max_dead_) ForgetLongestDead(dead_ - max_dead_);
  return expired;
}

void WorkerRegistry::ForgetLongestDead(int64_t n) {
  std::vector<std::pair<absl::Time, uint64_t>> dead;  // (lease expiry, number)
  for (const auto& [number, record] : workers_) {
    if (!record.alive) dead.emplace_back(record.lease_expiry, number);
  }
  n = std::min<int64_t>(n, static_cast<int64_t>(dead.size()));
  std::nth_element(dead.begin(), dead.begin() + n, dead.end());  // the n earliest expiries
  for (int64_t i = 0; i < n; ++i) workers_.erase(dead[i].second);
  dead_ -= n;
}

const WorkerRecord* WorkerRegistry::Find(absl::string_view worker_id) const {
  auto it = workers_.find(WorkerNumber(worker_id));
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<const WorkerRecord*> WorkerRegistry::All() const {
  std::vector<const WorkerRecord*> out;
  for (const auto& [number, record] : workers_) out.push_back(&record);
  return out;
}

int WorkerRegistry::LiveCount() const {
  int n = 0;
  for (const auto& [number, record] : workers_) n += record.alive ? 1 : 0;
  return n;
}

}  // namespace ckpt::coordinator
