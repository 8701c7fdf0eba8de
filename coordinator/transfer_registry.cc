#include "coordinator/transfer_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::coordinator {
namespace {

std::string VersionList(const std::vector<PublishedVersion>& versions) {
  std::vector<std::string> out;
  for (const PublishedVersion& v : versions) out.push_back(absl::StrCat(v.version));
  return absl::StrJoin(out, ", ");
}

}  // namespace

std::string PublishedCheckpointName(const std::string& name, int64_t version) {
  return absl::StrCat(name, ".v", version);
}

int64_t PublishedRegistry::NewestLocked(const std::string& name) const {
  int64_t newest = 0;
  if (auto it = published_.find(name); it != published_.end() && !it->second.empty()) {
    newest = it->second.back().version;
  }
  for (const auto& [op, r] : reserved_) {
    if (r.name == name) newest = std::max(newest, r.version);
  }
  return newest;
}

absl::StatusOr<int64_t> PublishedRegistry::Reserve(const std::string& name, int64_t requested,
                                                   const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = reserved_.find(operation_id); it != reserved_.end()) return it->second.version;
  const int64_t newest = NewestLocked(name);
  absl::StatusOr<int64_t> next = NextTransferVersion(name, requested, newest);
  if (!next.ok()) return next.status();
  const int64_t version = *next;
  if (version <= newest) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot publish ", TransferPathString(name, version), ": version ", version,
                     " is not newer than version ", newest,
                     " published (or being published) already; versions of a name only grow"));
  }
  reserved_[operation_id] = Reservation{name, version};
  return version;
}

absl::StatusOr<std::vector<PublishedVersion>> PublishedRegistry::Commit(
    const std::string& operation_id, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reserved_.find(operation_id);
  if (it == reserved_.end()) {
    return absl::NotFoundError(
        absl::StrCat("publish ", operation_id, " reserved no version to commit"));
  }
  const Reservation r = it->second;
  reserved_.erase(it);
  std::vector<PublishedVersion>& versions = published_[r.name];
  versions.push_back(PublishedVersion{r.version, PublishedCheckpointName(r.name, r.version), now});
  std::sort(
      versions.begin(), versions.end(),
      [](const PublishedVersion& a, const PublishedVersion& b) { return a.version < b.version; });
  std::vector<PublishedVersion> forgotten;
  while (static_cast<int>(versions.size()) > keep_versions_) {
    forgotten.push_back(versions.front());
    versions.erase(versions.begin());
  }
  return forgotten;
}

bool PublishedRegistry::Adopt(const std::string& name, int64_t version, absl::Time published) {
  if (version <= 0) return false;  // not a version (a path cannot name it)
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PublishedVersion>& versions = published_[name];
  for (const PublishedVersion& v : versions) {
    if (v.version == version) return false;
  }
  versions.push_back(PublishedVersion{version, PublishedCheckpointName(name, version), published});
  std::sort(
      versions.begin(), versions.end(),
      [](const PublishedVersion& a, const PublishedVersion& b) { return a.version < b.version; });
  bool kept = true;
  while (static_cast<int>(versions.size()) > keep_versions_) {
    if (versions.front().version == version) kept = false;
    versions.erase(versions.begin());
  }
  return kept;
}

void PublishedRegistry::Release(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_.erase(operation_id);
}

absl::StatusOr<PublishedVersion> PublishedRegistry::Resolve(const std::string& name,
                                                            int64_t requested) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = published_.find(name);
  if (it == published_.end() || it->second.empty()) {
    return absl::NotFoundError(absl::StrCat("nothing is published under ",
                                            TransferPathString(name, 0),
                                            " (a source must publish it first)"));
  }
  if (requested <= 0) return it->second.back();
  for (const PublishedVersion& v : it->second) {
    if (v.version == requested) return v;
  }
  return absl::NotFoundError(
      absl::StrCat(TransferPathString(name, requested),
                   " is not published (kept versions: ", VersionList(it->second), ")"));
}

std::map<std::string, std::vector<PublishedVersion>> PublishedRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

absl::StatusOr<std::pair<std::string, int64_t>> PublishedRegistry::Reserved(
    const std::string& operation_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reserved_.find(operation_id);
  if (it == reserved_.end()) {
    return absl::NotFoundError(absl::StrCat("publish ", operation_id, " reserved no version"));
  }
  return std::make_pair(it->second.name, it->second.version);
}

}  // namespace ckpt::coordinator
