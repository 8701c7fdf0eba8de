#include "coordinator/memory_catalog.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/memory_path.h"

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

pb::MemoryCheckpointRecord RecordOf(const MemoryCheckpoint& checkpoint) {
  pb::MemoryCheckpointRecord record;
  record.set_name(checkpoint.name);
  record.set_manifest(checkpoint.manifest.SerializeAsString());
  record.set_committed_unix_ms(absl::ToUnixMillis(checkpoint.committed));
  record.set_published_name(checkpoint.published_name);
  record.set_published_version(checkpoint.published_version);
  record.set_persist_to(checkpoint.persist_to);
  record.set_persist_overwrite(checkpoint.persist_overwrite);
  return record;
}

std::string RetentionGroupOfPublished(const std::string& published_name) {
  return published_name.empty() ? "" : absl::StrCat("xfer:", published_name);
}

std::string RetentionGroup(const MemoryCheckpoint& checkpoint) {
  return RetentionGroupOfPublished(checkpoint.published_name);
}

namespace {

// The checkpoints of retention `group`, oldest first: by commit time, then commit order
// (adopted checkpoints arrive in any order).
std::vector<std::pair<std::pair<absl::Time, int64_t>, std::string>> ByAge(
    const std::map<std::string, MemoryCheckpoint>& committed, const std::string& group) {
  std::vector<std::pair<std::pair<absl::Time, int64_t>, std::string>> by_age;
  for (const auto& [n, c] : committed) {
    if (RetentionGroup(c) == group) by_age.push_back({{c.committed, c.sequence}, n});
  }
  std::sort(by_age.begin(), by_age.end());
  return by_age;
}

// Whether every data file of `manifest` has a size in [0, 2^63) and their sum fits in int64
// (a worker's record is not trusted to: the sum is the checkpoint's bytes).
bool SizesFit(const pb::Manifest& manifest) {
  int64_t total = 0;
  for (const pb::DataFile& file : manifest.files()) {
    if (file.size_bytes() < 0 || file.size_bytes() > std::numeric_limits<int64_t>::max() - total) {
      return false;
    }
    total += file.size_bytes();
  }
  return true;
}

// A checkpoint rebuilt from a worker's record (after a coordinator restart).
MemoryCheckpoint FromRecord(const pb::HeldMemoryCheckpoint& held, pb::Manifest manifest) {
  const pb::MemoryCheckpointRecord& record = held.record();
  MemoryCheckpoint c;
  c.name = held.name();
  c.rebuilt = true;
  c.committed = absl::FromUnixMillis(record.committed_unix_ms());
  for (const pb::DataFile& file : manifest.files()) c.bytes += file.size_bytes();
  c.manifest = std::move(manifest);
  c.published_name = record.published_name();
  c.published_version = record.published_version();
  c.persist_to = record.persist_to();
  c.persist_overwrite = record.persist_overwrite();
  if (c.persist_to.empty()) return c;
  if (held.pinned()) {  // in flight when the coordinator stopped: started again
    c.persist_state = PersistState::kPersisting;
    c.persist_recovery = true;
  } else if (absl::StartsWith(held.persist_outcome(), "persisted to")) {
    c.persist_state = PersistState::kPersisted;
  } else {
    c.persist_state = PersistState::kFailed;
    c.persist_detail = held.persist_outcome().empty() ? "it ended before the coordinator restarted"
                                                      : held.persist_outcome();
  }
  return c;
}

}  // namespace

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
  const std::string group = RetentionGroup(checkpoint);
  checkpoint.sequence = next_sequence_++;
  for (const auto& [file, holders] : checkpoint.holders) {
    for (const MemoryHolder& h : holders) {
      if (!h.recorded) unrecorded_[h.worker_id].insert(name);
    }
  }
  if (auto old = evicted_.find(name); old != evicted_.end()) {  // saved again
    eviction_order_.erase(old->second.order);
    evicted_.erase(old);
  }
  committed_[name] = std::move(checkpoint);
  return ForgetBeyondLocked(keep_newest, group);
}

std::vector<std::string> MemoryCatalog::ForgetBeyondLocked(int keep_newest,
                                                           const std::string& group) {
  std::vector<std::string> forgotten;
  if (keep_newest <= 0) return forgotten;
  const auto by_age = ByAge(committed_, group);
  for (size_t i = 0; i + keep_newest < by_age.size(); ++i) {
    if (committed_[by_age[i].second].persist_state == PersistState::kPersisting) continue;
    RememberEvictionLocked(committed_[by_age[i].second], keep_newest, by_age.back().second);
    committed_.erase(by_age[i].second);
    for (auto& [worker, names] : unrecorded_) names.erase(by_age[i].second);
    forgotten.push_back(by_age[i].second);
  }
  return forgotten;
}

void MemoryCatalog::RememberEvictionLocked(const MemoryCheckpoint& checkpoint, int keep_newest,
                                           const std::string& newest) {
  Eviction eviction;
  eviction.when = absl::Now();
  eviction.keep_newest = keep_newest;
  eviction.group = RetentionGroup(checkpoint);
  eviction.newest = newest;
  if (checkpoint.persist_state == PersistState::kPersisted) {
    eviction.persisted_to = checkpoint.persist_to;
  }
  eviction.order = next_eviction_++;
  if (auto old = evicted_.find(checkpoint.name); old != evicted_.end()) {
    eviction_order_.erase(old->second.order);
  }
  evicted_[checkpoint.name] = eviction;
  eviction_order_[eviction.order] = checkpoint.name;
  while (eviction_order_.size() > kMaxEvictionsRemembered) {
    evicted_.erase(eviction_order_.begin()->second);
    eviction_order_.erase(eviction_order_.begin());
  }
}

absl::Status MemoryCatalog::CheckRoomForOneMore(int keep_newest, const std::string& group) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (keep_newest <= 0) return absl::OkStatus();
  const auto by_age = ByAge(committed_, group);
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
  return ForgetBeyondLocked(keep_newest, RetentionGroup(it->second));
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
  unrecorded_.erase(worker_id);
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

std::vector<RecordItem> MemoryCatalog::RecordsFor(const std::string& worker_id,
                                                  const std::set<std::string>& sent) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RecordItem> out;
  auto names = unrecorded_.find(worker_id);
  if (names == unrecorded_.end()) return out;
  for (const std::string& name : names->second) {
    auto it = committed_.find(name);
    if (it == committed_.end()) continue;
    std::string key = absl::StrCat("record/", name, "/", it->second.sequence);
    if (sent.count(key) > 0) continue;
    out.push_back({std::move(key), RecordOf(it->second)});
  }
  return out;
}

std::vector<std::string> MemoryCatalog::Adopt(
    const std::string& worker_id, const std::string& host,
    const google::protobuf::RepeatedPtrField<pb::HeldMemoryCheckpoint>& held) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> lines;
  for (const pb::HeldMemoryCheckpoint& h : held) lines.push_back(AdoptLocked(worker_id, host, h));
  return lines;
}

std::string MemoryCatalog::AdoptLocked(const std::string& worker_id, const std::string& host,
                                       const pb::HeldMemoryCheckpoint& held) {
  const std::string& name = held.name();
  auto refuse = [&](absl::string_view why) {
    return absl::StrCat("memory_copy_not_adopted checkpoint=mem://", name, " worker=", worker_id,
                        " reason=\"", why, "\"");
  };
  if (!MemoryCheckpointName(absl::StrCat(kMemoryPathPrefix, name)).ok()) {
    return refuse("its name is not a valid memory checkpoint name");
  }
  if (!held.complete()) return refuse("incomplete: its save never finished on this worker");
  if (!held.has_record()) {
    return refuse(
        "its commit was never recorded on this worker (not committed, or committed "
        "just before the coordinator stopped)");
  }
  if (claims_.count(name) > 0) return refuse("a save in flight claims the name");
  pb::Manifest manifest;
  if (!manifest.ParseFromString(held.record().manifest())) {
    return refuse("its record's manifest does not parse");
  }
  if (!SizesFit(manifest)) return refuse("its record's file sizes are negative or overflow");
  if (held.record().published_version() < 0) return refuse("its published version is negative");
  auto it = committed_.find(name);
  const bool created = it == committed_.end();
  if (created) {
    MemoryCheckpoint checkpoint = FromRecord(held, std::move(manifest));
    checkpoint.sequence = next_sequence_++;
    it = committed_.emplace(name, std::move(checkpoint)).first;
  } else if (it->second.manifest.SerializeAsString() != manifest.SerializeAsString()) {
    return refuse("its manifest differs from the one committed under that name");
  }
  MemoryCheckpoint& checkpoint = it->second;
  std::set<std::string> files;
  for (const pb::DataFile& file : checkpoint.manifest.files()) files.insert(file.name());
  int adopted = 0;
  for (const std::string& file : held.files()) {
    if (files.count(file) == 0) continue;
    std::vector<MemoryHolder>& lost = checkpoint.lost[file];
    lost.erase(std::remove_if(lost.begin(), lost.end(),
                              [&](const MemoryHolder& h) { return h.worker_id == worker_id; }),
               lost.end());
    std::vector<MemoryHolder>& holders = checkpoint.holders[file];
    auto mine = std::find_if(holders.begin(), holders.end(),
                             [&](const MemoryHolder& h) { return h.worker_id == worker_id; });
    if (mine == holders.end()) mine = holders.insert(holders.end(), {worker_id, host});
    mine->recorded = true;
    ++adopted;
  }
  if (auto u = unrecorded_.find(worker_id); u != unrecorded_.end()) u->second.erase(name);
  return absl::StrCat("memory_copy_adopted checkpoint=mem://", name, " worker=", worker_id,
                      " host=", host, " files=", adopted, " rebuilt=", created ? "true" : "false",
                      checkpoint.persist_recovery ? " persist=recovering" : "");
}

std::vector<std::string> MemoryCatalog::TakeRecoveredPersists(bool even_uncovered) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto& [name, checkpoint] : committed_) {
    if (!checkpoint.persist_recovery) continue;
    bool covered = true;
    for (const pb::DataFile& file : checkpoint.manifest.files()) {
      auto h = checkpoint.holders.find(file.name());
      if (h == checkpoint.holders.end() || h->second.empty()) covered = false;
    }
    if (!covered && !even_uncovered) continue;
    checkpoint.persist_recovery = false;
    out.push_back(name);
  }
  return out;
}

std::string MemoryCatalog::EvictedMessage(const std::string& name, const Eviction& e) {
  const bool published = absl::StartsWith(e.group, "xfer:");
  std::string why =
      published
          ? absl::StrCat("--transfer_keep_versions=", e.keep_newest, " (retention: the newest ",
                         e.keep_newest, " versions of xfer://", e.group.substr(5), " are kept)")
          : absl::StrCat("--memory_keep=", e.keep_newest, " (retention: the newest ", e.keep_newest,
                         " memory checkpoints are kept)");
  return absl::StrCat(
      "no memory checkpoint mem://", name, ": it was evicted by ", why, " at ",
      absl::FormatTime(e.when, absl::UTCTimeZone()), ", when mem://", e.newest, " was the newest",
      e.persisted_to.empty() ? "; save it again"
                             : absl::StrCat("; it was persisted to ", e.persisted_to,
                                            ": load that, or save it again"));
}

absl::StatusOr<MemoryCheckpoint> MemoryCatalog::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = committed_.find(name);
  if (it != committed_.end()) return it->second;
  auto evicted = evicted_.find(name);
  if (evicted == evicted_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no memory checkpoint mem://", name, " (never committed by a memory save)"));
  }
  return absl::NotFoundError(EvictedMessage(name, evicted->second));
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
