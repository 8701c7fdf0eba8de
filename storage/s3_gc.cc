#include "storage/s3_gc.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/manifest_codec.h"
#include "storage/s3/s3_url.h"

namespace ckpt {
namespace {

constexpr char kManifestObject[] = "manifest.pb";

// "g" and 16 lowercase hex digits: a generation name of storage/s3_store.cc.
bool IsGeneration(absl::string_view s) {
  if (s.size() != 17 || s[0] != 'g') return false;
  return std::all_of(s.begin() + 1, s.end(),
                     [](char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); });
}

// The objects of one generation prefix.
struct Generation {
  std::vector<std::string> keys;
  int64_t bytes = 0;
  absl::Time newest = absl::InfinitePast();
};

// Checkpoint name ("runs/step5") -> generation -> its objects.
using Found = std::map<std::string, std::map<std::string, Generation>>;

// Splits `key` as <name>/<generation>/<rest>, the generation being the last component (but
// the final one) that looks like one; false for any other key (manifests, foreign objects).
bool SplitDataKey(const std::string& key, std::string* name, std::string* generation) {
  std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
  for (int i = static_cast<int>(parts.size()) - 2; i >= 1; --i) {
    if (!IsGeneration(parts[i])) continue;
    *name = absl::StrJoin(parts.begin(), parts.begin() + i, "/");
    *generation = std::string(parts[i]);
    return !name->empty();
  }
  return false;
}

// Every object under `prefix`, grouped by checkpoint name and generation.
absl::StatusOr<Found> ListGenerations(S3Client& client, const std::string& bucket,
                                      const std::string& prefix, absl::Time deadline) {
  Found found;
  std::string token;
  do {
    CKPT_ASSIGN_OR_RETURN(S3ListPage page,
                          client.ListObjectsV2(bucket, prefix, token, 1000, deadline));
    for (const S3ObjectInfo& object : page.objects) {
      std::string name, generation;
      if (!SplitDataKey(object.key, &name, &generation)) continue;
      Generation& g = found[name][generation];
      g.keys.push_back(object.key);
      g.bytes += object.size;
      g.newest = std::max(g.newest, object.last_modified);
    }
    token = page.next_continuation_token;
  } while (!token.empty());
  return found;
}

// The generation the manifest committed under `name` names; nullopt when none is committed.
absl::StatusOr<std::optional<std::string>> CommittedGeneration(S3Client& client,
                                                               const std::string& bucket,
                                                               const std::string& name,
                                                               absl::Time deadline) {
  const std::string key = absl::StrCat(name, "/", kManifestObject);
  absl::StatusOr<int64_t> size = client.HeadObject(bucket, key, deadline);
  if (absl::IsNotFound(size.status())) return std::optional<std::string>();
  if (!size.ok()) return size.status();
  const std::string where = absl::StrCat("s3://", bucket, "/", key);
  if (*size >= kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat(where, ": a manifest of ", *size, " bytes"));
  }
  std::string bytes(static_cast<size_t>(*size), '\0');
  CKPT_RETURN_IF_ERROR(client.GetObjectRange(bucket, key, 0, absl::MakeSpan(bytes), deadline));
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ParseManifest(bytes, where));
  if (manifest.object_generation().empty()) {
    return absl::DataLossError(absl::StrCat(where, ": names no object generation"));
  }
  return std::optional<std::string>(manifest.object_generation());
}

// Why `generation` of `name` is garbage, or nullopt when the manifest committed now names it.
absl::StatusOr<std::optional<std::string>> GarbageReason(S3Client& client,
                                                         const std::string& bucket,
                                                         const std::string& name,
                                                         const std::string& generation,
                                                         absl::Time deadline) {
  CKPT_ASSIGN_OR_RETURN(std::optional<std::string> committed,
                        CommittedGeneration(client, bucket, name, deadline));
  if (!committed.has_value()) {
    return std::optional<std::string>(
        absl::StrCat("no manifest is committed at s3://", bucket, "/", name));
  }
  if (*committed == generation) return std::optional<std::string>();
  return std::optional<std::string>(absl::StrCat("the committed manifest names ", *committed));
}

// Collects the uncommitted generations of one checkpoint name.
void CollectName(S3Client& client, const std::string& bucket, const std::string& name,
                 const std::map<std::string, Generation>& generations, absl::Time cutoff,
                 bool dry_run, absl::Time deadline, S3GcReport* report) {
  absl::StatusOr<std::optional<std::string>> committed =
      CommittedGeneration(client, bucket, name, deadline);
  if (!committed.ok()) {
    report->unreadable.push_back(
        absl::StrCat("s3://", bucket, "/", name, ": ", committed.status().message()));
    return;
  }
  for (const auto& [generation, g] : generations) {
    if (committed->has_value() && **committed == generation) {
      ++report->committed;
      continue;
    }
    if (g.newest > cutoff) {
      ++report->young;
      continue;
    }
    S3GcLeftover leftover;
    leftover.kind = S3GcLeftover::Kind::kGeneration;
    leftover.url = absl::StrCat("s3://", bucket, "/", name, "/", generation, "/");
    leftover.objects = static_cast<int64_t>(g.keys.size());
    leftover.bytes = g.bytes;
    leftover.newest = g.newest;
    // Read again right before deleting: a writer may have committed it since the scan.
    absl::StatusOr<std::optional<std::string>> reason =
        GarbageReason(client, bucket, name, generation, deadline);
    if (!reason.ok()) {
      report->unreadable.push_back(absl::StrCat(leftover.url, ": ", reason.status().message()));
      continue;
    }
    if (!reason->has_value()) {
      ++report->committed;
      continue;
    }
    leftover.reason = **reason;
    if (!dry_run) {
      absl::Status deleted = client.DeleteObjects(bucket, g.keys, deadline);
      if (!deleted.ok()) leftover.error = std::string(deleted.message());
    }
    report->leftovers.push_back(std::move(leftover));
  }
}

// Collects the multipart uploads under `prefix` initiated before `cutoff`.
absl::Status CollectUploads(S3Client& client, const std::string& bucket, const std::string& prefix,
                            absl::Time cutoff, bool dry_run, absl::Time deadline,
                            S3GcReport* report) {
  CKPT_ASSIGN_OR_RETURN(std::vector<S3MultipartUpload> uploads,
                        client.ListMultipartUploads(bucket, prefix, deadline));
  for (const S3MultipartUpload& upload : uploads) {
    if (upload.initiated > cutoff) {
      ++report->young;
      continue;
    }
    S3GcLeftover leftover;
    leftover.kind = S3GcLeftover::Kind::kUpload;
    leftover.url = absl::StrCat("s3://", bucket, "/", upload.key);
    leftover.upload_id = upload.upload_id;
    leftover.newest = upload.initiated;
    leftover.reason = "a multipart upload never completed";
    if (!dry_run) {
      absl::Status aborted =
          client.AbortMultipartUpload(bucket, upload.key, upload.upload_id, deadline);
      if (!aborted.ok() && !absl::IsNotFound(aborted)) {
        leftover.error = std::string(aborted.message());
      }
    }
    report->leftovers.push_back(std::move(leftover));
  }
  return absl::OkStatus();
}

}  // namespace

int S3GcReport::failed() const {
  return static_cast<int>(std::count_if(leftovers.begin(), leftovers.end(),
                                        [](const S3GcLeftover& l) { return !l.error.empty(); }));
}

absl::StatusOr<S3GcReport> CollectS3Garbage(S3Client& client, const std::string& url,
                                            absl::Duration min_age, bool dry_run,
                                            absl::Time deadline) {
  CKPT_ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  if (min_age < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gc ", url, ": a negative minimum age (", absl::FormatDuration(min_age), ")"));
  }
  std::string prefix = location.prefix;
  if (!prefix.empty() && prefix.back() != '/') prefix += '/';
  // A zero minimum age takes everything, whatever the server's clock says (listings round
  // LastModified to the second, so an object just written may look a little in the future).
  const absl::Time cutoff =
      min_age == absl::ZeroDuration() ? absl::InfiniteFuture() : absl::Now() - min_age;
  S3GcReport report;
  CKPT_RETURN_IF_ERROR(
      CollectUploads(client, location.bucket, prefix, cutoff, dry_run, deadline, &report));
  CKPT_ASSIGN_OR_RETURN(Found found, ListGenerations(client, location.bucket, prefix, deadline));
  for (const auto& [name, generations] : found) {
    CollectName(client, location.bucket, name, generations, cutoff, dry_run, deadline, &report);
  }
  return report;
}

}  // namespace ckpt
