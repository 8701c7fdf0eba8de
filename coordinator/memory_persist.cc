#include "coordinator/memory_persist.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::coordinator {

absl::StatusOr<PersistAssignment> AssignPersistWriters(const MemoryCheckpoint& checkpoint,
                                                       const std::vector<std::string>& files,
                                                       const std::set<std::string>& excluded) {
  PersistAssignment out;
  std::vector<std::string> orphans;  // "file (held by ...)"
  for (const std::string& file : files) {
    std::vector<std::string> tried;
    const MemoryHolder* writer = nullptr;
    if (auto it = checkpoint.holders.find(file); it != checkpoint.holders.end()) {
      for (const MemoryHolder& h : it->second) {
        if (excluded.count(h.worker_id) == 0) {
          writer = &h;
          break;
        }
        tried.push_back(absl::StrCat(h.DebugString(), " (failed)"));
      }
    }
    if (auto it = checkpoint.lost.find(file); it != checkpoint.lost.end()) {
      for (const MemoryHolder& h : it->second) {
        tried.push_back(absl::StrCat(h.DebugString(), " (lost)"));
      }
    }
    if (writer == nullptr) {
      orphans.push_back(absl::StrCat(
          file, " (", tried.empty() ? "no recorded holder" : absl::StrJoin(tried, ", "), ")"));
      continue;
    }
    out[writer->worker_id].push_back(file);
  }
  if (!orphans.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot persist mem://", checkpoint.name,
                                                      ": no live copy is left of ",
                                                      absl::StrJoin(orphans, "; ")));
  }
  return out;
}

bool IsPersistedAt(const MemoryCheckpoint& checkpoint, const std::string& path) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
  if (!reader.ok()) return false;
  const pb::Manifest& there = (*reader)->manifest();
  const pb::Manifest& mine = checkpoint.manifest;
  if (there.files_size() != mine.files_size() || there.pieces_size() != mine.pieces_size()) {
    return false;
  }
  for (int i = 0; i < mine.files_size(); ++i) {
    if (there.files(i).SerializeAsString() != mine.files(i).SerializeAsString()) return false;
  }
  for (int i = 0; i < mine.pieces_size(); ++i) {
    if (there.pieces(i).SerializeAsString() != mine.pieces(i).SerializeAsString()) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<MemoryPersist>> MemoryPersist::Begin(MemoryCheckpoint checkpoint,
                                                                    const std::string& path,
                                                                    bool overwrite) {
  std::vector<std::string> files;
  for (const pb::DataFile& f : checkpoint.manifest.files()) files.push_back(f.name());
  absl::StatusOr<PersistAssignment> assignment = AssignPersistWriters(checkpoint, files, {});
  if (!assignment.ok()) return assignment.status();
  std::unique_ptr<MemoryPersist> persist(new MemoryPersist());
  absl::StatusOr<std::string> staging = IsObjectStoreLocation(path)
                                            ? persist->BeginStoreWrite(path, overwrite)
                                            : CreateStagingDir(path, overwrite);
  if (!staging.ok()) {
    return absl::Status(staging.status().code(),
                        absl::StrCat("cannot persist mem://", checkpoint.name, " to ", path, ": ",
                                     staging.status().message()));
  }
  persist->checkpoint_ = std::move(checkpoint);
  persist->path_ = path;
  persist->overwrite_ = overwrite;
  persist->staging_dir_ = *std::move(staging);
  for (const auto& [worker, its_files] : *assignment) {
    for (const std::string& file : its_files) persist->writer_of_[file] = worker;
  }
  return persist;
}

MemoryPersist::~MemoryPersist() { (void)Abort(); }

PersistAssignment MemoryPersist::pending() const {
  PersistAssignment out;
  for (const auto& [file, worker] : writer_of_) out[worker].push_back(file);
  return out;
}

absl::StatusOr<PersistAssignment> MemoryPersist::Report(const std::string& worker,
                                                        const std::vector<std::string>& files,
                                                        const absl::Status& result) {
  std::vector<std::string> mine;  // still pending on `worker` (a late report changes nothing)
  for (const std::string& file : files) {
    auto it = writer_of_.find(file);
    if (it == writer_of_.end() || it->second != worker) continue;
    mine.push_back(file);
    writer_of_.erase(it);
  }
  if (result.ok()) return PersistAssignment();
  // A failed worker is never chosen again, even when nothing was pending on it (it may be the
  // next holder of another worker's files).
  failed_.insert(worker);
  failures_[worker] = std::string(result.message());
  // Whatever else was pending on the failed worker moves too.
  for (auto it = writer_of_.begin(); it != writer_of_.end();) {
    if (it->second != worker) {
      ++it;
      continue;
    }
    mine.push_back(it->first);
    it = writer_of_.erase(it);
  }
  absl::StatusOr<PersistAssignment> again = AssignPersistWriters(checkpoint_, mine, failed_);
  if (!again.ok()) {
    std::vector<std::string> why;
    for (const auto& [w, message] : failures_) why.push_back(absl::StrCat(w, ": ", message));
    return absl::FailedPreconditionError(
        absl::StrCat(again.status().message(), "; failures: ", absl::StrJoin(why, "; ")));
  }
  for (const auto& [w, more] : *again) {
    for (const std::string& file : more) writer_of_[file] = w;
  }
  return again;
}

absl::StatusOr<PersistAssignment> MemoryPersist::WorkerFailed(const std::string& worker,
                                                              const absl::Status& why) {
  std::vector<std::string> files;
  for (const auto& [file, w] : writer_of_) {
    if (w == worker) files.push_back(file);
  }
  return Report(worker, files, why);
}

absl::Status MemoryPersist::Commit() {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("persistence of mem://", checkpoint_.name, " to ", path_, " has ended"));
  }
  if (!writer_of_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("persistence of mem://", checkpoint_.name,
                                                      " to ", path_, " still waits for ",
                                                      writer_of_.size(), " data file(s)"));
  }
  WriteOptions options;
  options.overwrite = overwrite_;
  options.checksum_block_bytes = checkpoint_.manifest.checksum_block_bytes();
  absl::Status committed =
      store_write_ != nullptr
          ? CommitStoreWrite()
          : CommitCheckpoint(staging_dir_, path_, checkpoint_.manifest, options);
  if (committed.ok()) {
    finished_ = true;
    return committed;
  }
  (void)Abort();
  return absl::Status(committed.code(), absl::StrCat("cannot persist mem://", checkpoint_.name,
                                                     " to ", path_, ": ", committed.message()));
}

absl::Status MemoryPersist::Abort() {
  if (finished_ || staging_dir_.empty()) return absl::OkStatus();
  finished_ = true;
  if (store_write_ != nullptr) return store_write_->Abort(absl::Now() + kStoreTimeout);
  return DiscardStagingDir(staging_dir_);
}

absl::StatusOr<std::string> MemoryPersist::BeginStoreWrite(const std::string& url, bool overwrite) {
  CKPT_ASSIGN_OR_RETURN(CheckpointStore * store, StoreForUrl(url));
  StoreWriteOptions options;
  options.overwrite = overwrite;
  CKPT_ASSIGN_OR_RETURN(store_write_, store->BeginWrite(url, options, absl::Now() + kStoreTimeout));
  return store_write_->staging_url();
}

absl::Status MemoryPersist::CommitStoreWrite() {
  const absl::Time deadline = absl::Now() + kStoreTimeout;
  for (const pb::DataFile& file : checkpoint_.manifest.files()) {
    CKPT_RETURN_IF_ERROR(store_write_->Adopt(file.name(), deadline));
  }
  return store_write_->Commit(checkpoint_.manifest, deadline);
}

}  // namespace ckpt::coordinator
