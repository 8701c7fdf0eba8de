#include "coordinator/store_writes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckpt::coordinator {

absl::StatusOr<std::string> StoreWrites::Begin(const std::string& id, const std::string& url,
                                               bool overwrite, absl::Time deadline) {
  if (std::string staging = StagingUrl(id); !staging.empty()) return staging;
  CKPT_ASSIGN_OR_RETURN(CheckpointStore * store, StoreForUrl(url));
  StoreWriteOptions options;
  options.overwrite = overwrite;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWrite> write,
                        store->BeginWrite(url, options, deadline));
  std::string staging = write->staging_url();
  std::lock_guard<std::mutex> lock(mu_);
  writes_[id] = std::move(write);
  return staging;
}

std::string StoreWrites::StagingUrl(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writes_.find(id);
  return it == writes_.end() ? "" : it->second->staging_url();
}

absl::Status StoreWrites::Commit(const std::string& id, const pb::Manifest& manifest,
                                 absl::Time deadline) {
  std::shared_ptr<CheckpointWrite> write;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = writes_.find(id);
    if (it != writes_.end()) write = it->second;
  }
  if (write == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", id, " has no write in a checkpoint store to commit"));
  }
  for (const pb::DataFile& file : manifest.files()) {
    CKPT_RETURN_IF_ERROR(write->Adopt(file.name(), deadline));
  }
  CKPT_RETURN_IF_ERROR(write->Commit(manifest, deadline));
  std::lock_guard<std::mutex> lock(mu_);
  writes_.erase(id);
  return absl::OkStatus();
}

absl::Status StoreWrites::Abort(const std::string& id, absl::Time deadline) {
  std::shared_ptr<CheckpointWrite> write;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = writes_.find(id);
    if (it == writes_.end()) return absl::OkStatus();
    write = std::move(it->second);
    writes_.erase(it);
  }
  return write->Abort(deadline);
}

}  // namespace ckpt::coordinator
