#include "storage/s3_store.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/manifest_codec.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3/s3_url.h"

namespace ckpt {
namespace {

constexpr char kManifestObject[] = "manifest.pb";
// An empty object under a write's generation, PUT by BeginWrite and deleted when the write
// commits or aborts: while it is there, the write is in progress and others may join it.
constexpr char kStagingMarker[] = "staging";

// Where one checkpoint lives: its bucket and key prefix ("ckpts/step5", no trailing '/').
struct S3Checkpoint {
  std::string url;
  std::string bucket;
  std::string prefix;
  std::string ManifestKey() const { return absl::StrCat(prefix, "/", kManifestObject); }
  std::string DataKey(const std::string& generation, const std::string& name) const {
    return absl::StrCat(prefix, "/", generation, "/", name);
  }
  std::string MarkerKey(const std::string& generation) const {
    return DataKey(generation, kStagingMarker);
  }
  // The staging URL of a write of `generation` (CheckpointWrite::staging_url).
  std::string StagingUrl(const std::string& generation) const {
    return absl::StrCat("s3://", bucket, "/", prefix, "/", generation);
  }
};

absl::StatusOr<S3Checkpoint> Locate(const std::string& url) {
  CKPT_ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  std::string prefix = location.prefix;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": a checkpoint needs a name under the bucket (s3://bucket/name)"));
  }
  return S3Checkpoint{url, location.bucket, prefix};
}

// A fresh generation name: 64 random bits, so concurrent writers never share objects.
std::string NewGeneration() {
  static std::mutex mu;
  static std::mt19937_64* rng = new std::mt19937_64(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrFormat("g%016x", (*rng)());
}

// "g" and 16 lowercase hex digits: a generation NewGeneration makes.
bool IsGeneration(absl::string_view s) {
  if (s.size() != 17 || s[0] != 'g') return false;
  for (char c : s.substr(1)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The checkpoint and generation `staging_url` names when it is spelled exactly as
// S3Checkpoint::StagingUrl spells one; InvalidArgument naming it otherwise. It comes over the
// network (coordinator to workers), so nothing looser is taken.
absl::StatusOr<std::pair<S3Checkpoint, std::string>> ParseStagingUrl(
    const std::string& staging_url) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(staging_url),
                     "\" is not the staging URL of an s3 checkpoint write: ", why));
  };
  absl::StatusOr<S3Location> location = ParseS3Url(staging_url);
  if (!location.ok()) return refuse(location.status().message());
  const size_t slash = location->prefix.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    return refuse("expected s3://bucket/<checkpoint>/<generation>");
  }
  const std::string generation = location->prefix.substr(slash + 1);
  if (!IsGeneration(generation)) return refuse("its last component is not a write's generation");
  absl::StatusOr<S3Checkpoint> at =
      Locate(absl::StrCat("s3://", location->bucket, "/", location->prefix.substr(0, slash)));
  if (!at.ok()) return refuse(at.status().message());
  if (at->StagingUrl(generation) != staging_url) {
    return refuse("it is not spelled as a write spells its staging URL");
  }
  return std::make_pair(*std::move(at), generation);
}

// The committed manifest of `at`, with its generation (cleared in the manifest). NotFound
// naming the URL when none is committed.
absl::StatusOr<std::pair<pb::Manifest, std::string>> ReadManifest(S3Client& client,
                                                                  const S3Checkpoint& at,
                                                                  absl::Time deadline) {
  absl::StatusOr<int64_t> size = client.HeadObject(at.bucket, at.ManifestKey(), deadline);
  if (absl::IsNotFound(size.status())) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint is committed at ", at.url, " (", size.status().message(), ")"));
  }
  if (!size.ok()) return size.status();
  if (*size >= kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat(at.url, ": manifest object of ", *size,
                                            " bytes is over the 2 GiB an s3 manifest may have"));
  }
  std::string bytes(static_cast<size_t>(*size), '\0');
  CKPT_RETURN_IF_ERROR(
      client.GetObjectRange(at.bucket, at.ManifestKey(), 0, absl::MakeSpan(bytes), deadline));
  const std::string where = absl::StrCat(at.url, "/", kManifestObject);
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ParseManifest(bytes, where));
  if (absl::Status valid = ValidateManifest(manifest); !valid.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", valid.message()));
  }
  std::string generation = manifest.object_generation();
  if (generation.empty() || !ValidateObjectKey(generation).ok() ||
      generation.find('/') != std::string::npos) {
    return absl::DataLossError(absl::StrCat(where, ": names no valid object generation"));
  }
  manifest.clear_object_generation();
  return std::make_pair(std::move(manifest), std::move(generation));
}

// The objects of a committed generation (its data objects and, if left, its staging marker).
std::vector<std::string> DataKeys(const S3Checkpoint& at, const pb::Manifest& manifest,
                                  const std::string& generation) {
  std::vector<std::string> keys;
  for (const pb::DataFile& file : manifest.files()) {
    keys.push_back(at.DataKey(generation, file.name()));
  }
  keys.push_back(at.MarkerKey(generation));  // when its delete at the commit failed
  return keys;
}

// Before a commit: every data object `manifest` lists is under `generation`, with the size
// the manifest says. A gc (storage/s3_gc.h) or anything else that deleted or replaced one
// behind the writer's back fails the commit here, FailedPrecondition naming the object, before
// the manifest is PUT.
absl::Status CheckDataObjects(S3Client& client, const S3Checkpoint& at,
                              const pb::Manifest& manifest, const std::string& generation,
                              absl::Time deadline) {
  for (const pb::DataFile& file : manifest.files()) {
    const std::string key = at.DataKey(generation, file.name());
    absl::StatusOr<int64_t> size = client.HeadObject(at.bucket, key, deadline);
    if (absl::IsNotFound(size.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("s3://", at.bucket, "/", key, " of the checkpoint being committed at ",
                       at.url, " is gone (removed behind the writer's back); nothing committed"));
    }
    if (!size.ok()) return size.status();
    if (*size != file.size_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "s3://", at.bucket, "/", key, " of the checkpoint being committed at ", at.url, " has ",
          *size, " bytes, its manifest says ", file.size_bytes(), "; nothing committed"));
    }
  }
  return absl::OkStatus();
}

// One object: buffered up to one part, then a multipart upload; one PUT when it stays small.
class S3ObjectWriter final : public ObjectWriter {
 public:
  // `stored` (when set) runs once the object is stored, before it counts as closed; its error
  // fails the Close.
  S3ObjectWriter(S3Client* client, const S3MultipartWriterOptions& multipart, std::string bucket,
                 std::string key, absl::Time deadline, std::function<void(int64_t size)> closed,
                 std::function<absl::Status(absl::Time)> stored)
      : client_(client),
        multipart_options_(multipart),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        deadline_(deadline),
        closed_(std::move(closed)),
        stored_(std::move(stored)) {}

  absl::Status Append(absl::string_view bytes) override {
    size_ += static_cast<int64_t>(bytes.size());
    if (multipart_ != nullptr) return multipart_->Write(bytes);
    buffer_.append(bytes.data(), bytes.size());
    if (static_cast<int64_t>(buffer_.size()) < multipart_options_.part_size) {
      return absl::OkStatus();
    }
    CKPT_ASSIGN_OR_RETURN(multipart_, S3MultipartWriter::Start(client_, bucket_, key_,
                                                               multipart_options_, deadline_));
    absl::Status written = multipart_->Write(buffer_);
    std::string().swap(buffer_);
    return written;
  }

  absl::Status Close(absl::Time deadline) override {
    if (multipart_ != nullptr) {
      CKPT_RETURN_IF_ERROR(multipart_->Finish());
    } else {
      CKPT_RETURN_IF_ERROR(client_->PutObject(bucket_, key_, buffer_, deadline));
    }
    if (stored_) CKPT_RETURN_IF_ERROR(stored_(deadline));
    closed_(size_);
    return absl::OkStatus();
  }

 private:
  S3Client* const client_;
  const S3MultipartWriterOptions multipart_options_;
  const std::string bucket_;
  const std::string key_;
  const absl::Time deadline_;
  const std::function<void(int64_t)> closed_;
  const std::function<absl::Status(absl::Time)> stored_;
  std::string buffer_;
  std::unique_ptr<S3MultipartWriter> multipart_;  // null while the object fits one part
  int64_t size_ = 0;
};

// One write: its objects under a fresh generation until the manifest is PUT. Or, joined
// (JoinWrite), another process's part of such a write: its objects go under the beginning
// write's generation, each checked once stored against the write having ended meanwhile.
class S3Write final : public CheckpointWrite {
 public:
  S3Write(S3Client* client, S3MultipartWriterOptions multipart, S3Checkpoint at, bool overwrite,
          absl::Time deadline, std::string generation, bool joined)
      : CheckpointWrite(at.url, joined),
        client_(client),
        multipart_(multipart),
        at_(std::move(at)),
        overwrite_(overwrite),
        deadline_(deadline),
        generation_(std::move(generation)) {}
  ~S3Write() override {
    if (done_) return;
    const absl::Time deadline = absl::Now() + multipart_.abort_timeout;
    if (joined()) {
      (void)RemoveOwn(UnclosedObjects(), deadline);
    } else {
      (void)AbortWrite(deadline);
    }
  }

  // A beginning write's first request: its staging marker, which JoinWrite looks for.
  absl::Status PutMarker(absl::Time deadline) {
    return client_->PutObject(at_.bucket, at_.MarkerKey(generation_), "", deadline);
  }

  std::string staging_url() const override { return at_.StagingUrl(generation_); }

 protected:
  absl::StatusOr<std::unique_ptr<ObjectWriter>> CreateObject(const std::string& name) override {
    const std::string key = at_.DataKey(generation_, name);
    {
      std::lock_guard<std::mutex> lock(mu_);
      names_.push_back(name);
    }
    std::function<absl::Status(absl::Time)> stored;
    if (joined()) {
      stored = [this, name](absl::Time deadline) { return CheckStillStaging(name, deadline); };
    }
    return std::unique_ptr<ObjectWriter>(std::make_unique<S3ObjectWriter>(
        client_, multipart_, at_.bucket, key, deadline_,
        [this, name](int64_t size) { RecordClosed(name, size); }, std::move(stored)));
  }

  absl::StatusOr<int64_t> StagedObjectSize(const std::string& name, absl::Time deadline) override {
    const std::string key = at_.DataKey(generation_, name);
    absl::StatusOr<int64_t> size = client_->HeadObject(at_.bucket, key, deadline);
    if (absl::IsNotFound(size.status())) {
      return absl::NotFoundError(
          absl::StrCat("s3://", at_.bucket, "/", key, " is not in the staging area of ", at_.url));
    }
    return size;
  }

  absl::Status CommitManifest(const pb::Manifest& manifest, absl::Time deadline) override;
  absl::Status AbortWrite(absl::Time deadline) override;

 private:
  absl::Status CheckStillStaging(const std::string& name, absl::Time deadline);
  absl::Status RemoveStagingArea(absl::Time deadline);
  absl::Status RemoveOwn(const std::vector<std::string>& names, absl::Time deadline);

  S3Client* const client_;
  const S3MultipartWriterOptions multipart_;
  const S3Checkpoint at_;
  const bool overwrite_;
  const absl::Time deadline_;
  const std::string generation_;
  bool done_ = false;
  std::mutex mu_;
  std::vector<std::string> names_;  // the objects this write created
};

absl::Status S3Write::CommitManifest(const pb::Manifest& manifest, absl::Time deadline) {
  std::optional<std::pair<pb::Manifest, std::string>> replaced;
  absl::StatusOr<std::pair<pb::Manifest, std::string>> old = ReadManifest(*client_, at_, deadline);
  if (old.ok()) {
    if (!overwrite_) {
      return absl::AlreadyExistsError(
          absl::StrCat("a checkpoint was committed at ", at_.url, " while this one was written"));
    }
    replaced = *std::move(old);
  } else if (!absl::IsNotFound(old.status()) && !overwrite_) {
    return old.status();
  }
  CKPT_RETURN_IF_ERROR(CheckDataObjects(*client_, at_, manifest, generation_, deadline));
  pb::Manifest stored = manifest;
  stored.set_object_generation(generation_);
  CKPT_RETURN_IF_ERROR(
      client_->PutObject(at_.bucket, at_.ManifestKey(), SerializeManifest(stored), deadline));
  done_ = true;
  // Committed. The marker and the replaced generation's objects go now; what a failure here
  // leaves is garbage no manifest names (never a committed checkpoint's data), or the marker,
  // which Delete and the next overwrite remove.
  (void)client_->DeleteObject(at_.bucket, at_.MarkerKey(generation_), deadline);
  if (replaced.has_value() && replaced->second != generation_) {
    (void)client_->DeleteObjects(at_.bucket, DataKeys(at_, replaced->first, replaced->second),
                                 deadline);
  }
  return absl::OkStatus();
}

absl::Status S3Write::AbortWrite(absl::Time deadline) {
  if (done_) return absl::OkStatus();
  done_ = true;
  if (!joined()) return RemoveStagingArea(deadline);
  // Once the beginning write ended its closed objects are its own (committed, or removed by
  // its abort): only the unclosed ones are removed then.
  absl::StatusOr<int64_t> marker =
      client_->HeadObject(at_.bucket, at_.MarkerKey(generation_), deadline);
  if (absl::IsNotFound(marker.status())) return RemoveOwn(UnclosedObjects(), deadline);
  CKPT_RETURN_IF_ERROR(marker.status());
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    names = names_;
  }
  return RemoveOwn(names, deadline);
}

// The marker first (from then on JoinWrite refuses the write and joined writers' objects
// stored later remove themselves: CheckStillStaging), then everything under the generation,
// whoever stored it, then multipart uploads still open there.
absl::Status S3Write::RemoveStagingArea(absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(client_->DeleteObject(at_.bucket, at_.MarkerKey(generation_), deadline));
  const std::string prefix = at_.DataKey(generation_, "");
  std::string token;
  do {
    CKPT_ASSIGN_OR_RETURN(S3ListPage page,
                          client_->ListObjectsV2(at_.bucket, prefix, token, 1000, deadline));
    std::vector<std::string> keys;
    for (const S3ObjectInfo& object : page.objects) keys.push_back(object.key);
    if (!keys.empty()) CKPT_RETURN_IF_ERROR(client_->DeleteObjects(at_.bucket, keys, deadline));
    token = page.next_continuation_token;
  } while (!token.empty());
  // A multipart upload whose own abort failed (the server was down when its part failed), or a
  // joined writer's upload in flight, still holds parts: found by the prefix, aborted here.
  CKPT_ASSIGN_OR_RETURN(std::vector<S3MultipartUpload> uploads,
                        client_->ListMultipartUploads(at_.bucket, prefix, deadline));
  for (const S3MultipartUpload& upload : uploads) {
    CKPT_RETURN_IF_ERROR(
        client_->AbortMultipartUpload(at_.bucket, upload.key, upload.upload_id, deadline));
  }
  return absl::OkStatus();
}

// The objects `names` of this (joined) write, and any upload of theirs still open.
absl::Status S3Write::RemoveOwn(const std::vector<std::string>& names, absl::Time deadline) {
  if (names.empty()) return absl::OkStatus();
  std::vector<std::string> keys;
  for (const std::string& name : names) keys.push_back(at_.DataKey(generation_, name));
  CKPT_RETURN_IF_ERROR(client_->DeleteObjects(at_.bucket, keys, deadline));
  for (const std::string& key : keys) {
    CKPT_ASSIGN_OR_RETURN(std::vector<S3MultipartUpload> uploads,
                          client_->ListMultipartUploads(at_.bucket, key, deadline));
    for (const S3MultipartUpload& upload : uploads) {
      if (upload.key != key) continue;
      CKPT_RETURN_IF_ERROR(
          client_->AbortMultipartUpload(at_.bucket, upload.key, upload.upload_id, deadline));
    }
  }
  return absl::OkStatus();
}

// A joined write's object `name` was just stored. While the marker is there the beginning
// write is in progress (its abort deletes the marker before listing what to remove, so it
// finds the object). Without it the write ended: the object stays only when the committed
// manifest of this generation lists it; otherwise it is removed and the Close fails.
absl::Status S3Write::CheckStillStaging(const std::string& name, absl::Time deadline) {
  absl::StatusOr<int64_t> marker =
      client_->HeadObject(at_.bucket, at_.MarkerKey(generation_), deadline);
  if (marker.ok()) return absl::OkStatus();
  if (!absl::IsNotFound(marker.status())) return marker.status();
  absl::StatusOr<std::pair<pb::Manifest, std::string>> committed =
      ReadManifest(*client_, at_, deadline);
  if (!committed.ok() && !absl::IsNotFound(committed.status())) return committed.status();
  if (committed.ok() && committed->second == generation_) {
    for (const pb::DataFile& file : committed->first.files()) {
      if (file.name() == name) return absl::OkStatus();
    }
  }
  const std::string key = at_.DataKey(generation_, name);
  (void)client_->DeleteObject(at_.bucket, key, deadline);
  return absl::NotFoundError(
      absl::StrCat("s3://", at_.bucket, "/", key, ": the write of ", at_.url,
                   " it joined (staging area ", staging_url(),
                   ") ended before the object was closed: it was aborted, or committed "
                   "without it; the object was removed"));
}

class S3StoredCheckpoint final : public StoredCheckpoint {
 public:
  S3StoredCheckpoint(S3Client* client, S3Checkpoint at, pb::Manifest manifest,
                     std::string generation)
      : StoredCheckpoint(at.url, std::move(manifest)),
        client_(client),
        at_(std::move(at)),
        generation_(std::move(generation)) {}

 protected:
  absl::Status ReadObject(const std::string& name, int64_t offset, absl::Span<char> dest,
                          absl::Time deadline) const override {
    return client_->GetObjectRange(at_.bucket, at_.DataKey(generation_, name), offset, dest,
                                   deadline);
  }

 private:
  S3Client* const client_;
  const S3Checkpoint at_;
  const std::string generation_;
};

class S3Store final : public CheckpointStore {
 public:
  S3Store(std::unique_ptr<S3Client> client, S3MultipartWriterOptions multipart)
      : client_(std::move(client)), multipart_(multipart) {}

  absl::string_view scheme() const override { return "s3"; }

  absl::StatusOr<std::unique_ptr<CheckpointWrite>> BeginWrite(const std::string& url,
                                                              const StoreWriteOptions& options,
                                                              absl::Time deadline) override {
    CKPT_ASSIGN_OR_RETURN(S3Checkpoint at, Locate(url));
    absl::StatusOr<int64_t> existing = client_->HeadObject(at.bucket, at.ManifestKey(), deadline);
    if (existing.ok() && !options.overwrite) {
      return absl::AlreadyExistsError(
          absl::StrCat("a checkpoint is committed at ", url, " (overwrite it only on request)"));
    }
    if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();
    if (!existing.ok()) {
      // A HEAD answers 404 for a missing bucket too; a listing tells them apart (NoSuchBucket
      // is NotFound naming the bucket) before anything is uploaded.
      CKPT_RETURN_IF_ERROR(client_->ListObjectsV2(at.bucket, at.prefix, "", 1, deadline).status());
    }
    auto write = std::make_unique<S3Write>(client_.get(), multipart_, std::move(at),
                                           options.overwrite, deadline, NewGeneration(),
                                           /*joined=*/false);
    CKPT_RETURN_IF_ERROR(write->PutMarker(deadline));
    return std::unique_ptr<CheckpointWrite>(std::move(write));
  }

  absl::StatusOr<std::unique_ptr<CheckpointWrite>> JoinWrite(const std::string& staging_url,
                                                             absl::Time deadline) override {
    CKPT_ASSIGN_OR_RETURN(auto parsed, ParseStagingUrl(staging_url));
    S3Checkpoint& at = parsed.first;
    absl::StatusOr<int64_t> marker =
        client_->HeadObject(at.bucket, at.MarkerKey(parsed.second), deadline);
    if (absl::IsNotFound(marker.status())) {
      return absl::NotFoundError(
          absl::StrCat("the write of ", at.url, " whose staging URL is ", staging_url,
                       " is gone: it was aborted or committed, or never begun (",
                       marker.status().message(), ")"));
    }
    if (!marker.ok()) return marker.status();
    return std::unique_ptr<CheckpointWrite>(
        std::make_unique<S3Write>(client_.get(), multipart_, std::move(at), /*overwrite=*/false,
                                  deadline, std::move(parsed.second), /*joined=*/true));
  }

  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> Open(const std::string& url,
                                                         absl::Time deadline) override {
    CKPT_ASSIGN_OR_RETURN(S3Checkpoint at, Locate(url));
    CKPT_ASSIGN_OR_RETURN(auto committed, ReadManifest(*client_, at, deadline));
    return std::unique_ptr<StoredCheckpoint>(std::make_unique<S3StoredCheckpoint>(
        client_.get(), std::move(at), std::move(committed.first), std::move(committed.second)));
  }

  absl::Status Delete(const std::string& url, absl::Time deadline) override {
    CKPT_ASSIGN_OR_RETURN(S3Checkpoint at, Locate(url));
    CKPT_ASSIGN_OR_RETURN(auto committed, ReadManifest(*client_, at, deadline));
    // The manifest first: from then on no reader takes the checkpoint.
    CKPT_RETURN_IF_ERROR(client_->DeleteObject(at.bucket, at.ManifestKey(), deadline));
    return client_->DeleteObjects(at.bucket, DataKeys(at, committed.first, committed.second),
                                  deadline);
  }

 private:
  const std::unique_ptr<S3Client> client_;
  const S3MultipartWriterOptions multipart_;
};

// A positive integer from environment variable `name` (unset: `*out` unchanged), at least
// `min`; InvalidArgument naming the variable otherwise.
absl::Status IntFromEnvironment(const char* name, int64_t min, int64_t* out) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", value, ": expected an integer of at least ", min));
  }
  *out = parsed;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<S3StoreOptions> S3StoreOptionsFromEnvironment() {
  CKPT_ASSIGN_OR_RETURN(S3Settings settings, LoadS3SettingsFromEnvironment());
  S3StoreOptions options;
  options.client = S3ClientOptionsFrom(settings);
  if (const char* ca = std::getenv("AWS_CA_BUNDLE"); ca != nullptr && *ca != '\0') {
    options.client.ca_file = ca;
  }
  if (const char* addressing = std::getenv("CKPT_S3_ADDRESSING"); addressing != nullptr) {
    const absl::string_view a = addressing;
    if (a == "virtual") {
      options.client.addressing = S3Addressing::kVirtualHosted;
    } else if (a != "path" && !a.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CKPT_S3_ADDRESSING=", a, ": expected path or virtual"));
    }
  }
  CKPT_RETURN_IF_ERROR(
      IntFromEnvironment("CKPT_S3_PART_SIZE", int64_t{5} << 20, &options.multipart.part_size));
  int64_t in_flight = options.multipart.parts_in_flight;
  CKPT_RETURN_IF_ERROR(IntFromEnvironment("CKPT_S3_PARTS_IN_FLIGHT", 1, &in_flight));
  options.multipart.parts_in_flight = static_cast<int>(std::min<int64_t>(in_flight, 64));
  return options;
}

namespace {

absl::StatusOr<std::unique_ptr<CheckpointStore>> S3StoreFromEnvironment() {
  CKPT_ASSIGN_OR_RETURN(S3StoreOptions options, S3StoreOptionsFromEnvironment());
  return MakeS3Store(std::move(options));
}

CheckpointStoreRegistration s3_registration("s3", S3StoreFromEnvironment);

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStore>> MakeS3Store(S3StoreOptions options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(options.client));
  return std::unique_ptr<CheckpointStore>(
      std::make_unique<S3Store>(std::move(client), options.multipart));
}

}  // namespace ckpt
