#include "worker/memory_tier.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/checksum.h"

namespace ckpt::worker {

absl::StatusOr<EncodedFile> EncodeDataFile(const std::vector<TensorMeta>& tensors,
                                           const DataFilePlan& plan, int index,
                                           int64_t checksum_block_bytes) {
  CKPT_ASSIGN_OR_RETURN(DataFileLayout layout,
                        LayOutDataFile(tensors, plan, index, /*require_data=*/true));
  if (layout.records.files.size() != 1 || layout.records.pieces.size() != plan.pieces.size()) {
    return absl::InternalError(absl::StrCat("laying out ", layout.name, " gave ",
                                            layout.records.files.size(), " file records"));
  }
  auto bytes = std::make_shared<std::string>();
  bytes->reserve(static_cast<size_t>(layout.records.files[0].size_bytes()));
  bytes->append(layout.header);
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const PieceData& p = plan.pieces[i];
    pb::StoredPiece& stored = layout.records.pieces[i];
    if (stored.byte_offset() != static_cast<int64_t>(bytes->size())) {
      return absl::InternalError(absl::StrCat(layout.name, ": piece of ", p.key, " laid out at ",
                                              stored.byte_offset(), ", encoded at ",
                                              bytes->size()));
    }
    bytes->append(static_cast<const char*>(p.data), static_cast<size_t>(p.size_bytes));
    StreamingChecksum checksum(checksum_block_bytes);
    checksum.Update(p.data, static_cast<size_t>(p.size_bytes));
    SetStoredChecksums(checksum.Whole(), checksum.Blocks(), checksum_block_bytes, &stored);
  }
  if (static_cast<int64_t>(bytes->size()) != layout.records.files[0].size_bytes()) {
    return absl::InternalError(absl::StrCat(layout.name, ": encoded ", bytes->size(),
                                            " bytes, laid out ",
                                            layout.records.files[0].size_bytes()));
  }
  EncodedFile out;
  out.name = layout.name;
  out.bytes = std::move(bytes);
  out.records = std::move(layout.records);
  return out;
}

bool MemoryTier::MakeRoomLocked(int64_t needed, const std::string& keep) {
  if (held_ + needed <= options_.budget_bytes) return true;
  // Candidates: complete checkpoints other than `keep` and the newest complete one of each
  // retention group (the last copy of that name's state stays).
  std::map<std::string, std::pair<int64_t, std::string>> newest_of_group;
  for (const auto& [name, e] : entries_) {
    if (!e.complete) continue;
    auto [it, fresh] = newest_of_group.try_emplace(e.group, e.sequence, name);
    if (!fresh && it->second.first < e.sequence) it->second = {e.sequence, name};
  }
  std::set<std::string> newest;
  for (const auto& [group, n] : newest_of_group) newest.insert(n.second);
  std::vector<std::pair<int64_t, std::string>> complete;  // (sequence, name)
  for (const auto& [name, e] : entries_) {
    if (e.complete && name != keep && newest.count(name) == 0)
      complete.emplace_back(e.sequence, name);
  }
  std::sort(complete.begin(), complete.end());
  complete.erase(std::remove_if(complete.begin(), complete.end(),
                                [&](const auto& c) { return entries_[c.second].pinned; }),
                 complete.end());  // awaiting persistence
  int64_t freeable = 0;
  size_t evict = 0;
  while (held_ - freeable + needed > options_.budget_bytes && evict < complete.size()) {
    freeable += entries_[complete[evict++].second].bytes;
  }
  if (held_ - freeable + needed > options_.budget_bytes) return false;
  for (size_t i = 0; i < evict; ++i) {
    held_ -= entries_[complete[i].second].bytes;
    entries_.erase(complete[i].second);
    NoteEvictedLocked(complete[i].second);
  }
  return true;
}

absl::Status MemoryTier::Put(const std::string& name, const std::string& operation_id,
                             const std::string& file, std::shared_ptr<const std::string> bytes) {
  const int64_t size = bytes == nullptr ? 0 : static_cast<int64_t>(bytes->size());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  bool pinned = false;  // a pin outlives the leftover it replaces
  // A Pin placeholder (no operation yet, not complete) is kept; anything else from another
  // operation is a leftover.
  const bool placeholder =
      it != entries_.end() && it->second.operation_id.empty() && !it->second.complete;
  if (it != entries_.end() && !placeholder && it->second.operation_id != operation_id) {
    pinned = it->second.pinned;
    held_ -= it->second.bytes;  // left by a save that never committed under this name
    entries_.erase(it);
    it = entries_.end();
  }
  int64_t replaced = 0;
  if (it != entries_.end()) {
    auto f = it->second.files.find(file);
    if (f != it->second.files.end()) replaced = static_cast<int64_t>(f->second->size());
  }
  if (!MakeRoomLocked(size - replaced, name)) {
    std::vector<std::string> holders;
    for (const auto& [n, e] : entries_) {
      holders.push_back(absl::StrCat(n, " (", e.bytes, " bytes", e.complete ? "" : ", in progress",
                                     e.pinned ? ", awaiting persistence" : "", ")"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.worker, ": memory tier cannot keep ", file, " of mem://", name, " (", size,
        " bytes): ", held_, " of its ", options_.budget_bytes, " byte budget are held by ",
        holders.empty() ? "nothing" : absl::StrJoin(holders, ", "),
        " and neither the newest complete checkpoint nor one awaiting persistence is evicted "
        "for a save in progress"));
  }
  Entry& e = entries_[name];
  e.pinned = e.pinned || pinned;
  if (e.operation_id.empty()) {
    e.operation_id = operation_id;
    e.sequence = next_sequence_++;
  }
  e.bytes += size - replaced;
  held_ += size - replaced;
  e.files[file] = std::move(bytes);
  return absl::OkStatus();
}

void MemoryTier::Seal(const std::string& name, int keep_newest, const std::string& group) {
  const int keep = std::max(keep_newest > 0 ? keep_newest : options_.keep_newest, 1);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    // A rank with no data files: the checkpoint is complete here with nothing in it.
    Entry& e = entries_[name];
    e.sequence = next_sequence_++;
    it = entries_.find(name);
  }
  it->second.complete = true;
  it->second.group = group;
  keep_of_group_[group] = keep;
  KeepNewestLocked(keep, group);
}

void MemoryTier::KeepNewestLocked(int keep, const std::string& group) {
  std::vector<std::pair<int64_t, std::string>> complete;
  for (const auto& [n, e] : entries_) {
    if (e.complete && e.group == group) complete.emplace_back(e.sequence, n);
  }
  std::sort(complete.rbegin(), complete.rend());
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < complete.size(); ++i) {
    Entry& e = entries_[complete[i].second];
    if (e.pinned) continue;  // awaiting persistence
    held_ -= e.bytes;
    entries_.erase(complete[i].second);
    NoteEvictedLocked(complete[i].second);
  }
}

void MemoryTier::NoteEvictedLocked(const std::string& name) {
  evicted_.push_back(name);
  if (evicted_.size() > 1024) evicted_.erase(evicted_.begin());
}

std::vector<std::string> MemoryTier::TakeEvicted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.swap(evicted_);
  return out;
}

void MemoryTier::Pin(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = entries_.try_emplace(name);
  if (inserted) it->second.sequence = next_sequence_++;
  it->second.pinned = true;
}

void MemoryTier::Unpin(const std::string& name, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  it->second.pinned = false;
  it->second.persist_outcome = outcome;
  const std::string group = it->second.group;  // `it` may be evicted below
  if (auto keep = keep_of_group_.find(group); keep != keep_of_group_.end()) {
    KeepNewestLocked(keep->second, group);
  }
}

bool MemoryTier::Record(const std::string& name, std::string record) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.complete) return false;
  it->second.record = std::move(record);
  return true;
}

void MemoryTier::Drop(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  held_ -= it->second.bytes;
  entries_.erase(it);
}

absl::StatusOr<std::shared_ptr<const std::string>> MemoryTier::Find(const std::string& name,
                                                                    const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(options_.worker, " holds no memory checkpoint mem://",
                                            name, " (never saved here, or evicted)"));
  }
  auto f = it->second.files.find(file);
  if (f == it->second.files.end()) {
    return absl::NotFoundError(
        absl::StrCat(options_.worker, " holds no copy of ", file, " of mem://", name));
  }
  return f->second;
}

std::vector<HeldCheckpoint> MemoryTier::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HeldCheckpoint> out;
  for (const auto& [name, e] : entries_) {
    HeldCheckpoint h;
    h.name = name;
    h.operation_id = e.operation_id;
    h.complete = e.complete;
    h.pinned = e.pinned;
    h.bytes = e.bytes;
    for (const auto& [file, bytes] : e.files) h.files.push_back(file);
    h.record = e.record;
    h.group = e.group;
    h.persist_outcome = e.persist_outcome;
    out.push_back(std::move(h));
  }
  return out;
}

int64_t MemoryTier::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

namespace {

// Verifies [b, e) of piece `p` in `file` (b, e block-aligned, or the whole piece).
absl::Status VerifySpan(const pb::StoredPiece& p, const std::string& file, int64_t b, int64_t e,
                        int64_t block, const std::string& name) {
  const char* base = file.data() + p.byte_offset();
  auto mismatch = [&](int64_t at) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in tensor \"", p.key(), "\" of ",
                                            p.file(), " of mem://", name, " at byte ", at,
                                            " of the piece (memory corrupted)"));
  };
  if (p.block_xxh3_size() == 0) {
    if (Xxh3(base, static_cast<size_t>(p.byte_length())) != p.xxh3_64()) return mismatch(0);
    return absl::OkStatus();
  }
  for (int64_t at = b; at < e; at += block) {
    const int64_t n = std::min(block, p.byte_length() - at);
    if (Xxh3(base + at, static_cast<size_t>(n)) != p.block_xxh3(static_cast<int>(at / block))) {
      return mismatch(at);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadHeldPieces(const MemoryTier& tier, const std::string& name,
                            const pb::Manifest& manifest, const std::vector<PieceRead>& reads) {
  const int64_t block = manifest.checksum_block_bytes();
  for (const PieceRead& r : reads) {
    if (r.piece < 0 || r.piece >= manifest.pieces_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no stored piece ", r.piece, " in mem://", name));
    }
    const pb::StoredPiece& p = manifest.pieces(r.piece);
    if (r.begin < 0 || r.begin > r.end || r.end > p.byte_length()) {
      return absl::InvalidArgumentError(absl::StrCat("byte range [", r.begin, ", ", r.end,
                                                     ") is outside tensor \"", p.key(), "\" in ",
                                                     p.file(), " of mem://", name));
    }
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> file, tier.Find(name, p.file()));
    if (p.byte_offset() < 0 ||
        p.byte_offset() + p.byte_length() > static_cast<int64_t>(file->size())) {
      return absl::DataLossError(absl::StrCat("tensor \"", p.key(), "\" lies beyond the ",
                                              file->size(), " bytes held of ", p.file(),
                                              " of mem://", name));
    }
    if (r.begin == r.end) continue;
    if (block > 0) {
      const int64_t b = r.begin / block * block;
      const int64_t e = std::min((r.end + block - 1) / block * block, p.byte_length());
      CKPT_RETURN_IF_ERROR(VerifySpan(p, *file, b, e, block, name));
    } else {
      CKPT_RETURN_IF_ERROR(VerifySpan(p, *file, 0, p.byte_length(), p.byte_length(), name));
    }
    std::memcpy(r.dest, file->data() + p.byte_offset() + r.begin,
                static_cast<size_t>(r.end - r.begin));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
