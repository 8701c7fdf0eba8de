#include "coordinator/memory_catalog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator {

std::string MemoryHolder::DebugString() const {
  return absl::StrCat("worker ", worker_id, " on host ", host,
                      evicted ? ", which evicted it from its memory tier" : "");
}

std::string PersistDescription(PersistState state, const std::string& path,
                               const std::string& detail) {
  switch (state) {
    case PersistState::kNotAsked:
      return "";
    case PersistState::kPersisting:
      return absl::StrCat("persisting to ", path);
    case PersistState::kPersisted:
      return absl::StrCat("persisted to ", path);
    case PersistState::kFailed:
      return absl::StrCat("persist to ", path, " failed: ", detail);
  }
  return "";
}

absl::Status MemoryCatalog::Claim(const std::string& name, const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (committed_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("memory checkpoint mem://", name,
                                                 " exists already (memory saves never overwrite)"));
  }
  auto [it, fresh] = claims_.emplace(name, operation_id);
  if (!fresh && it->second != operation_id) {
    return absl::AlreadyExistsError(absl::StrCat("memory checkpoint mem://", name,
                                                 " is being saved by operation ", it->second));
  }
  return absl::OkStatus();
}

void MemoryCatalog::Release(const std::string& name, const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = claims_.find(name);
  if (it != claims_.end() && it->second == operation_id) claims_.erase(it);
}

absl::StatusOr<std::vector<std::string>> MemoryCatalog::Commit(const std::string& operation_id,
                                                               MemoryCheckpoint checkpoint,
                                                               int keep_newest) {
  std::lock_guard<std::mutex> lock(mu_);
  auto claim = claims_.find(checkpoint.name);
  if (claim == claims_.end() || claim->second != operation_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "operation ", operation_id, " does not hold the claim on mem://", checkpoint.name));
  }
  claims_.erase(claim);
  std::string name = checkpoint.name;
  checkpoint.sequence = next_sequence_++;
  committed_[name] = std::move(checkpoint);
  return ForgetBeyondLocked(keep_newest);
}

std::vector<std::string> MemoryCatalog::ForgetBeyondLocked(int keep_newest) {
  std::vector<std::string> forgotten;
  if (keep_newest <= 0 || static_cast<int>(committed_.size()) <= keep_newest) return forgotten;
  std::vector<std::pair<int64_t, std::string>> by_age;
  for (const auto& [n, c] : committed_) by_age.emplace_back(c.sequence, n);
  std::sort(by_age.begin(), by_age.end());
  for (size_t i = 0; i + keep_newest < by_age.size(); ++i) {
    if (committed_[by_age[i].second].persist_state == PersistState::kPersisting) continue;
    committed_.erase(by_age[i].second);
    forgotten.push_back(by_age[i].second);
  }
  return forgotten;
}

absl::Status MemoryCatalog::CheckRoomForOneMore(int keep_newest) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (keep_newest <= 0 || static_cast<int>(committed_.size()) < keep_newest) {
    return absl::OkStatus();
  }
  std::vector<std::pair<int64_t, std::string>> by_age;
  for (const auto& [n, c] : committed_) by_age.emplace_back(c.sequence, n);
  std::sort(by_age.begin(), by_age.end());
  // The ones the next commit forgets: all but the newest keep_newest - 1.
  for (size_t i = 0; i + keep_newest <= by_age.size(); ++i) {
    const MemoryCheckpoint& old = committed_.at(by_age[i].second);
    if (old.persist_state != PersistState::kPersisting) continue;
    return absl::ResourceExhaustedError(
        absl::StrCat("a new memory checkpoint would evict mem://", old.name, " (keep newest ",
                     keep_newest, "), which waits for its persistence to ", old.persist_to,
                     " to finish; save again once `ckptctl status` shows it persisted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemoryCatalog::SetPersistState(const std::string& name,
                                                                        PersistState state,
                                                                        const std::string& detail,
                                                                        int keep_newest) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = committed_.find(name);
  if (it == committed_.end()) {
    return absl::NotFoundError(absl::StrCat("no memory checkpoint mem://", name, " to persist"));
  }
  it->second.persist_state = state;
  it->second.persist_detail = detail;
  if (state == PersistState::kPersisting) return std::vector<std::string>();
  return ForgetBeyondLocked(keep_newest);
}

bool MemoryCatalog::DropHolderLocked(MemoryCheckpoint& checkpoint, const std::string& worker_id,
                                     bool evicted) {
  bool lost_some = false;
  for (auto& [file, holders] : checkpoint.holders) {
    auto gone = std::stable_partition(holders.begin(), holders.end(), [&](const MemoryHolder& h) {
      return h.worker_id != worker_id;
    });
    if (gone == holders.end()) continue;
    std::vector<MemoryHolder>& lost = checkpoint.lost[file];
    for (auto it = gone; it != holders.end(); ++it) {
      lost.push_back(*it);
      lost.back().evicted = evicted;
    }
    holders.erase(gone, holders.end());
    lost_some = true;
  }
  return lost_some;
}

std::vector<std::string> MemoryCatalog::DropWorker(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> touched;
  for (auto& [name, checkpoint] : committed_) {
    if (DropHolderLocked(checkpoint, worker_id, /*evicted=*/false)) touched.push_back(name);
  }
  return touched;
}

std::vector<std::string> MemoryCatalog::DropEvicted(const std::string& worker_id,
                                                    const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> touched;
  for (const std::string& name : names) {
    auto it = committed_.find(name);
    if (it == committed_.end()) continue;  // forgotten here already (keep-newest)
    if (DropHolderLocked(it->second, worker_id, /*evicted=*/true)) touched.push_back(name);
  }
  return touched;
}

absl::StatusOr<MemoryCheckpoint> MemoryCatalog::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = committed_.find(name);
  if (it == committed_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no memory checkpoint mem://", name, " (never committed by a memory save)"));
  }
  return it->second;
}

void MemoryCatalog::ToProto(
    google::protobuf::RepeatedPtrField<pb::MemoryCheckpointStatus>* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, checkpoint] : committed_) {
    pb::MemoryCheckpointStatus* s = out->Add();
    s->set_name(name);
    s->set_bytes(checkpoint.bytes);
    s->set_files(checkpoint.manifest.files_size());
    s->set_committed_unix_ms(absl::ToUnixMillis(checkpoint.committed));
    s->set_persist(PersistDescription(checkpoint.persist_state, checkpoint.persist_to,
                                      checkpoint.persist_detail));
    for (const pb::DataFile& file : checkpoint.manifest.files()) {
      auto holders = checkpoint.holders.find(file.name());
      if (holders == checkpoint.holders.end()) continue;
      for (const MemoryHolder& h : holders->second) {
        pb::MemoryReplicaStatus* r = s->add_replicas();
        r->set_file(file.name());
        r->set_worker_id(h.worker_id);
        r->set_host(h.host);
        r->set_bytes(file.size_bytes());
      }
    }
  }
}

}  // namespace ckpt::coordinator
