#include "tools/ckptctl/store_staging.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "common/store_url.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_store.h"
#include "storage/file_util.h"

namespace ckpt::ckptctl {
namespace {

absl::Status Named(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

const char kStoreStagingHelp[] =
    "A checkpoint may be an object-store URL (s3://bucket/prefix; credentials and endpoint from\n"
    "the standard AWS environment). Read from a URL, it is read in place (ranged GETs of the\n"
    "bytes needed, checksums verified; nothing written to local disk), except by export --to\n"
    "dcp, whose converter opens files by path: that first copies it (verified) into a private\n"
    "temporary directory under $TMPDIR (local disk for the whole checkpoint). Written to a URL,\n"
    "the checkpoint is produced in a private temporary directory under $TMPDIR, then copied up\n"
    "verified and committed by the store. The directories are removed afterwards.\n\n";

absl::Status RequireLocal(const std::string& location, const std::string& what) {
  if (!IsObjectStoreLocation(location)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the ", what, " '", location,
                   "' is an object-store URL; safetensors and DCP files are read and written "
                   "only in local directories (only ckpt checkpoints live at s3:// URLs)"));
}

absl::StatusOr<std::unique_ptr<PrivateTempDir>> PrivateTempDir::Create(const std::string& purpose) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = JoinPath(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                 absl::StrCat("ckptctl-", purpose, "-XXXXXX"));
  if (::mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    return ErrnoStatus(errno, absl::StrCat("create a temporary directory ", pattern));
  }
  return std::unique_ptr<PrivateTempDir>(new PrivateTempDir(pattern));
}

PrivateTempDir::~PrivateTempDir() { RemoveTree(path_).IgnoreError(); }

absl::StatusOr<std::unique_ptr<ReadableCheckpoint>> ReadableCheckpoint::Open(
    const std::string& location) {
  auto out = std::make_unique<ReadableCheckpoint>();
  if (!IsObjectStoreLocation(location)) {
    out->path_ = location;
    return out;
  }
  absl::StatusOr<std::unique_ptr<PrivateTempDir>> temp = PrivateTempDir::Create("fetch");
  if (!temp.ok()) return Named(temp.status(), absl::StrCat("fetching ", location));
  out->temp_ = *std::move(temp);
  out->path_ = JoinPath(out->temp_->path(), "checkpoint");
  absl::StatusOr<CopyReport> copied = CopyCheckpoint(location, out->path_);
  if (!copied.ok()) {
    return Named(copied.status(),
                 absl::StrCat("fetching ", location, " into a temporary directory"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<WritableCheckpoint>> WritableCheckpoint::Create(
    const std::string& location, bool overwrite) {
  auto out = std::make_unique<WritableCheckpoint>();
  out->location_ = location;
  out->overwrite_ = overwrite;
  if (!IsObjectStoreLocation(location)) {
    out->path_ = location;
    return out;
  }
  absl::StatusOr<CheckpointStore*> store = StoreForUrl(location);
  if (!store.ok()) return store.status();
  if (!overwrite) {
    auto existing = (*store)->Open(location, absl::Now() + absl::Minutes(1));
    if (existing.ok()) {
      return absl::AlreadyExistsError(absl::StrCat("a committed checkpoint exists at ", location,
                                                   "; give --overwrite to replace it"));
    }
    if (!absl::IsNotFound(existing.status())) return existing.status();
  }
  absl::StatusOr<std::unique_ptr<PrivateTempDir>> temp = PrivateTempDir::Create("stage");
  if (!temp.ok()) return Named(temp.status(), absl::StrCat("writing ", location));
  out->temp_ = *std::move(temp);
  out->path_ = JoinPath(out->temp_->path(), "checkpoint");
  return out;
}

absl::Status WritableCheckpoint::Publish() {
  if (temp_ == nullptr) return absl::OkStatus();
  CopyOptions options;
  options.overwrite = overwrite_;
  absl::StatusOr<CopyReport> copied = CopyCheckpoint(path_, location_, options);
  if (!copied.ok()) return Named(copied.status(), absl::StrCat("uploading to ", location_));
  return absl::OkStatus();
}

}  // namespace ckpt::ckptctl
