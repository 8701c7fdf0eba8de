#include "storage/store_objects.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checksum.h"
#include "storage/manifest_codec.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3/s3_url.h"

namespace ckpt {
namespace {

// The s3 store's layout (storage/s3_store.h): the manifest object and, per committed write,
// its data objects under "<prefix>/<generation>/".
constexpr char kManifestObject[] = "manifest.pb";

// The bucket and key prefix (no trailing '/') of the checkpoint at `url`.
absl::StatusOr<S3Location> LocateS3(const std::string& url) {
  if (!absl::StartsWith(url, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": no object reader serves this scheme (only s3:// and directories)"));
  }
  CKPT_ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  while (!location.prefix.empty() && location.prefix.back() == '/') location.prefix.pop_back();
  if (location.prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": a checkpoint needs a name under the bucket (s3://bucket/name)"));
  }
  return location;
}

// The process's client, made from the AWS environment on first success.
absl::StatusOr<S3Client*> ProcessClient() {
  static std::mutex mu;
  static S3Client* client = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (client != nullptr) return client;
  CKPT_ASSIGN_OR_RETURN(S3Settings settings, LoadS3SettingsFromEnvironment());
  S3ClientOptions options = S3ClientOptionsFrom(settings);
  if (const char* ca = std::getenv("AWS_CA_BUNDLE"); ca != nullptr && *ca != '\0') {
    options.ca_file = ca;
  }
  if (const char* a = std::getenv("CKPT_S3_ADDRESSING"); a != nullptr) {
    if (absl::string_view(a) == "virtual") {
      options.addressing = S3Addressing::kVirtualHosted;
    } else if (absl::string_view(a) != "path" && *a != '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("CKPT_S3_ADDRESSING=", a, ": expected path or virtual"));
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> made, S3Client::Create(std::move(options)));
  client = made.release();
  return client;
}

// OK when `generation` can be a generation name of the s3 store (one key segment).
absl::Status CheckGeneration(const std::string& generation, absl::string_view where) {
  if (generation.empty() || generation.find('/') != std::string::npos ||
      !ValidateObjectKey(generation).ok()) {
    return absl::DataLossError(absl::StrCat(where, ": names no valid object generation"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<pb::Manifest> ReadStoreManifest(const std::string& url, absl::Time deadline) {
  CKPT_ASSIGN_OR_RETURN(S3Location at, LocateS3(url));
  CKPT_ASSIGN_OR_RETURN(S3Client * client, ProcessClient());
  const std::string key = absl::StrCat(at.prefix, "/", kManifestObject);
  absl::StatusOr<int64_t> size = client->HeadObject(at.bucket, key, deadline);
  if (absl::IsNotFound(size.status())) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint is committed at ", url, " (", size.status().message(), ")"));
  }
  CKPT_RETURN_IF_ERROR(size.status());
  const std::string where = absl::StrCat(url, "/", kManifestObject);
  if (*size >= kMaxManifestBytes) {
    return absl::DataLossError(
        absl::StrCat(where, ": ", *size, " bytes, over the 2 GiB an s3 manifest may have"));
  }
  std::string bytes(static_cast<size_t>(*size), '\0');
  CKPT_RETURN_IF_ERROR(client->GetObjectRange(at.bucket, key, 0, absl::MakeSpan(bytes), deadline));
  absl::StatusOr<pb::Manifest> manifest = ParseManifest(bytes, where);
  if (!manifest.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", manifest.status().message()));
  }
  if (absl::Status valid = ValidateManifest(*manifest); !valid.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", valid.message()));
  }
  CKPT_RETURN_IF_ERROR(CheckGeneration(manifest->object_generation(), where));
  return manifest;
}

absl::StatusOr<std::unique_ptr<StoreObjects>> StoreObjects::Open(const std::string& url,
                                                                 const pb::Manifest& manifest) {
  CKPT_ASSIGN_OR_RETURN(S3Location at, LocateS3(url));
  absl::Status generation = CheckGeneration(manifest.object_generation(),
                                            absl::StrCat("the manifest of checkpoint ", url));
  if (!generation.ok()) return absl::InvalidArgumentError(generation.message());
  CKPT_ASSIGN_OR_RETURN(S3Client * client, ProcessClient());
  std::unique_ptr<StoreObjects> objects(new StoreObjects());
  objects->url_ = url;
  objects->client_ = client;
  objects->bucket_ = at.bucket;
  objects->key_prefix_ = absl::StrCat(at.prefix, "/", manifest.object_generation(), "/");
  return objects;
}

std::string StoreObjects::Describe(absl::string_view name) const {
  return absl::StrCat("s3://", bucket_, "/", key_prefix_, name);
}

absl::StatusOr<int64_t> StoreObjects::Size(absl::string_view name, absl::Time deadline) const {
  absl::StatusOr<int64_t> size =
      client_->HeadObject(bucket_, absl::StrCat(key_prefix_, name), deadline);
  if (!size.ok()) {
    return absl::Status(size.status().code(),
                        absl::StrCat("data object ", Describe(name), " of checkpoint ", url_, ": ",
                                     size.status().message()));
  }
  return size;
}

absl::Status StoreObjects::Read(absl::string_view name, int64_t offset, absl::Span<char> dest,
                                absl::Time deadline) const {
  absl::Status s =
      client_->GetObjectRange(bucket_, absl::StrCat(key_prefix_, name), offset, dest, deadline);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("data object ", Describe(name), " of checkpoint ",
                                             url_, ": ", s.message()));
}

absl::Status CheckObjectSizes(const StoreObjects& objects, const pb::Manifest& manifest,
                              absl::Time deadline) {
  for (const pb::DataFile& f : manifest.files()) {
    CKPT_ASSIGN_OR_RETURN(int64_t size, objects.Size(f.name(), deadline));
    if (size != f.size_bytes()) {
      return absl::DataLossError(absl::StrCat("data object ", objects.Describe(f.name()), " is ",
                                              size, " bytes; the manifest says ", f.size_bytes(),
                                              size < f.size_bytes() ? " (truncated)" : ""));
    }
  }
  return absl::OkStatus();
}

namespace {

// DataLoss for a range whose bytes do not match its checksums.
absl::Status Mismatch(const StoreObjects& objects, const RangeRead& r, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checksum mismatch reading ", r.label, " from ",
                                          objects.Describe(r.path), " at [", r.offset, ", ",
                                          r.offset + r.length, "): ", what));
}

// Checks the bytes of `r`, all in place at r.dest, against its checksums.
absl::Status VerifyRange(const StoreObjects& objects, const RangeRead& r) {
  if (!r.verify) return absl::OkStatus();
  const char* bytes = static_cast<const char*>(r.dest);
  if (r.block_bytes == 0) {
    const uint64_t got = Xxh3(bytes, static_cast<size_t>(r.length));
    if (r.expected.size() != 1 || got != r.expected[0]) {
      return Mismatch(
          objects, r,
          absl::StrCat("XXH3-64 ", got, " != expected ", r.expected.empty() ? 0 : r.expected[0]));
    }
    return absl::OkStatus();
  }
  const int64_t blocks = (r.length + r.block_bytes - 1) / r.block_bytes;
  if (blocks != static_cast<int64_t>(r.expected.size())) {
    return Mismatch(
        objects, r,
        absl::StrCat(blocks, " blocks read, ", r.expected.size(), " checksums expected"));
  }
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t at = i * r.block_bytes;
    const uint64_t got =
        Xxh3(bytes + at, static_cast<size_t>(std::min(r.block_bytes, r.length - at)));
    if (got != r.expected[i]) {
      return Mismatch(objects, r,
                      absl::StrCat("block ", i, " (bytes [", r.offset + at, ", ...)) has XXH3-64 ",
                                   got, ", expected ", r.expected[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadObjectRanges(const StoreObjects& objects, absl::Span<const RangeRead> reads,
                              const IoOptions& io, absl::Time deadline) {
  struct Chunk {
    size_t range;
    int64_t begin;  // within the range
    int64_t length;
  };
  const int64_t chunk_bytes = std::max<int64_t>(int64_t{1} << 20, io.buffer_bytes);
  std::vector<Chunk> chunks;
  std::unique_ptr<std::atomic<int64_t>[]> left(new std::atomic<int64_t>[reads.size()]);
  for (size_t i = 0; i < reads.size(); ++i) {
    int64_t n = 0;
    for (int64_t b = 0; b < reads[i].length; b += chunk_bytes, ++n) {
      chunks.push_back({i, b, std::min(chunk_bytes, reads[i].length - b)});
    }
    left[i] = n;
    if (n == 0) CKPT_RETURN_IF_ERROR(VerifyRange(objects, reads[i]));
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < chunks.size();) {
      const Chunk& c = chunks[j];
      const RangeRead& r = reads[c.range];
      absl::Status s = objects.Read(
          r.path, r.offset + c.begin,
          absl::MakeSpan(static_cast<char*>(r.dest) + c.begin, static_cast<size_t>(c.length)),
          deadline);
      // The thread that completes a range verifies it.
      if (s.ok() && left[c.range].fetch_sub(1) == 1) s = VerifyRange(objects, r);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        next = chunks.size();
      }
    }
  };
  const size_t threads = std::min<size_t>(
      chunks.size(),
      static_cast<size_t>(std::max(1, io.num_threads) * std::max(1, io.queue_depth)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  if (threads > 0) work();
  for (std::thread& t : pool) t.join();
  if (first.ok() && io.stats != nullptr) {
    for (const RangeRead& r : reads) io.stats->bytes += r.length;
  }
  return first;
}

}  // namespace ckpt
