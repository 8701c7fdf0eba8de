#include "storage/checkpoint_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "storage/manifest_codec.h"

namespace ckpt {

absl::Status CheckpointWrite::Reserve(const std::string& name, absl::string_view already) {
  if (absl::Status valid = ValidateDataFileName(name); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", url_, ": object \"", name, "\" is not a data file name: ", valid.message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!objects_.emplace(name, -1).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", url_, ": object ", name, " was already ", already));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> CheckpointWrite::Create(const std::string& name) {
  if (absl::Status reserved = Reserve(name, "created"); !reserved.ok()) return reserved;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> writer = CreateObject(name);
  if (!writer.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.erase(name);
  }
  return writer;
}

void CheckpointWrite::RecordClosed(const std::string& name, int64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_[name] = size;
}

std::vector<std::string> CheckpointWrite::UnclosedObjects() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> unclosed;
  for (const auto& [name, size] : objects_) {
    if (size < 0) unclosed.push_back(name);
  }
  return unclosed;
}

absl::Status CheckpointWrite::Adopt(const std::string& name, absl::Time deadline) {
  if (joined_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", url_, ": a joined write cannot adopt ", name,
                     "; the write that began the checkpoint adopts its objects"));
  }
  CKPT_RETURN_IF_ERROR(Reserve(name, "created or adopted"));
  absl::StatusOr<int64_t> size = StagedObjectSize(name, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  if (!size.ok()) {
    objects_.erase(name);
    return absl::Status(size.status().code(),
                        absl::StrCat("checkpoint ", url_, ": adopting object ", name, ": ",
                                     size.status().message()));
  }
  objects_[name] = *size;
  return absl::OkStatus();
}

absl::Status CheckpointWrite::Commit(const pb::Manifest& manifest, absl::Time deadline) {
  if (joined_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", url_, ": a joined write (staging area ", staging_url(),
                     ") cannot commit; the write that began the checkpoint commits it"));
  }
  if (absl::Status valid = ValidateManifest(manifest); !valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat("checkpoint ", url_, ": manifest: ", valid.message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, int64_t> unlisted = objects_;
    for (const pb::DataFile& file : manifest.files()) {
      auto it = objects_.find(file.name());
      if (it == objects_.end() || it->second < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint ", url_, ": data file ", file.name(),
                         it == objects_.end() ? " was never written" : " was not closed"));
      }
      if (it->second != file.size_bytes()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint ", url_, ": data file ", file.name(), " holds ", it->second,
                         " bytes but the manifest records ", file.size_bytes()));
      }
      unlisted.erase(file.name());
    }
    if (!unlisted.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", url_, ": object ",
                                                        unlisted.begin()->first,
                                                        " was written but the manifest lacks it"));
    }
  }
  return CommitManifest(manifest, deadline);
}

absl::Status CheckpointWrite::Abort(absl::Time deadline) { return AbortWrite(deadline); }

StoredCheckpoint::StoredCheckpoint(std::string url, pb::Manifest manifest)
    : url_(std::move(url)), manifest_(std::move(manifest)) {
  for (const pb::DataFile& file : manifest_.files()) file_sizes_[file.name()] = file.size_bytes();
}

absl::Status StoredCheckpoint::Read(const std::string& name, int64_t offset, absl::Span<char> dest,
                                    absl::Time deadline) const {
  auto listed = file_sizes_.find(name);
  if (listed == file_sizes_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", url_, ": its manifest lists no data file ", name));
  }
  const int64_t end = offset + static_cast<int64_t>(dest.size());
  if (offset < 0 || end > listed->second) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", url_, ": bytes [", offset, ", ", end,
                                              ") of ", name, " are outside its ", listed->second,
                                              " bytes"));
  }
  if (dest.empty()) return absl::OkStatus();
  return ReadObject(name, offset, dest, deadline);
}

namespace {

struct Registry {
  std::mutex mu;
  absl::flat_hash_map<std::string, CheckpointStoreFactory> factories;
  absl::flat_hash_map<std::string, std::unique_ptr<CheckpointStore>> made;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

void RegisterCheckpointStore(const std::string& scheme, CheckpointStoreFactory factory) {
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.factories[scheme] = std::move(factory);
  registry.made.erase(scheme);
}

std::vector<std::string> RegisteredStoreSchemes() {
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  std::vector<std::string> schemes;
  for (const auto& [scheme, factory] : registry.factories) schemes.push_back(scheme);
  std::sort(schemes.begin(), schemes.end());
  return schemes;
}

absl::StatusOr<CheckpointStore*> StoreForUrl(absl::string_view url) {
  const std::string scheme = LocationScheme(url);
  std::vector<std::string> known = RegisteredStoreSchemes();
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  if (auto made = registry.made.find(scheme); made != registry.made.end()) {
    return made->second.get();
  }
  auto factory = registry.factories.find(scheme);
  if (factory == registry.factories.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no checkpoint store serves ", url, " (scheme ", scheme,
                     "; registered: ", absl::StrJoin(known, ", "), ")"));
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, factory->second());
  CheckpointStore* raw = store.get();
  registry.made[scheme] = std::move(store);
  return raw;
}

}  // namespace ckpt
