// What a crashed writer leaves in an object store, found and removed: `ckptctl gc s3://…`.
//
// An s3 checkpoint at s3://bucket/name is name/manifest.pb (the commit point, naming its
// generation) plus data objects under name/<generation>/… (storage/s3_store.h). A writer that
// dies before its commit leaves (a) multipart uploads never completed nor aborted and (b) a
// generation prefix name/g<16 hex>/ that no committed manifest names; an overwrite whose
// delete of the replaced generation failed leaves (b) too. Both are collected once older than
// `min_age` (younger ones may be a write in progress). The generation a committed manifest names
// is never touched, nor anything under a name whose manifest cannot be read; each generation's
// manifest is read again just before its objects are deleted. A writer that commits a
// generation gc has begun to delete fails its commit (S3Write::CommitManifest checks every data
// object first), so a cleanup never corrupts a commit.
#ifndef CKPT_STORAGE_S3_GC_H_
#define CKPT_STORAGE_S3_GC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/s3/s3_client.h"

namespace ckpt {

// One leftover: an unfinished multipart upload or an uncommitted generation prefix.
struct S3GcLeftover {
  enum class Kind { kUpload, kGeneration };
  Kind kind = Kind::kGeneration;
  std::string url;        // s3://bucket/name/g…/ (a generation) or s3://bucket/key (an upload)
  std::string upload_id;  // uploads only
  int64_t objects = 0;    // objects under the generation (0 for an upload)
  int64_t bytes = -1;     // their total size; -1 for an upload (a listing gives no part sizes)
  absl::Time newest;      // the newest object's LastModified, or the upload's Initiated
  std::string reason;     // why it is garbage
  std::string error;      // non-empty when its removal failed (the rest still ran)
};

// What one collection found and did.
struct S3GcReport {
  std::vector<S3GcLeftover> leftovers;  // removed, or to remove with dry_run
  int young = 0;                        // leftovers younger than min_age, left alone
  int committed = 0;                    // generations a committed manifest names, kept
  std::vector<std::string> unreadable;  // names whose manifest could not be read: left alone
  int failed() const;                   // leftovers whose removal failed
};

// Scans s3://bucket/prefix (a checkpoint or a prefix holding many; the whole bucket when there
// is no prefix) and removes what it finds (nothing with `dry_run`). Errors of the listings or
// of reading a manifest's existence come back as the status; a failed removal is recorded in
// its leftover. A zero `min_age` takes leftovers of any age (only when no write is running).
// Every request ends by `deadline`.
absl::StatusOr<S3GcReport> CollectS3Garbage(S3Client& client, const std::string& url,
                                            absl::Duration min_age, bool dry_run,
                                            absl::Time deadline);

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_GC_H_
