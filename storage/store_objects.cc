#include "storage/store_objects.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>
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

namespace {

// Object bytes two ranges may have between them and still be fetched by one GET: about what
// one connection moves in one request's latency (100 MB/s x 40 ms), so fetching the gap costs
// no more than another round trip would. A checkpoint interleaves small replicated tensors
// (norms, biases) with large sharded ones; without this each would be a GET of its own.
constexpr int64_t kCoalesceGapBytes = int64_t{4} << 20;

// One GET of ReadObjectRanges: bytes [begin, begin + length) of one object, for either a part of
// one range (`ranges` holds it alone, read straight into its destination at `begin` -
// range.offset) or several whole ranges close together in the object (read into a buffer, then
// copied out to each).
struct ObjectGet {
  std::vector<size_t> ranges;
  int64_t begin = 0;
  int64_t length = 0;
  bool coalesced = false;
};

// The GETs for `reads`: ranges of the same object lying within kCoalesceGapBytes of each other
// are fetched together while the GET stays within `max_bytes`; a longer range is cut into
// `max_bytes` GETs. `parts[i]` counts the GETs range i takes.
std::vector<ObjectGet> PlanGets(absl::Span<const RangeRead> reads, int64_t max_bytes,
                                std::vector<int64_t>& parts) {
  std::vector<size_t> order;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (reads[i].length > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::tie(reads[x].path, reads[x].offset) < std::tie(reads[y].path, reads[y].offset);
  });
  std::vector<ObjectGet> gets;
  parts.assign(reads.size(), 0);
  for (size_t i : order) {
    const RangeRead& r = reads[i];
    if (!gets.empty()) {
      ObjectGet& last = gets.back();
      const RangeRead& prev = reads[last.ranges.back()];
      const int64_t end = std::max(last.begin + last.length, r.offset + r.length);
      // A GET holding only a part of a longer range is never merged into.
      const bool whole =
          last.coalesced || (last.begin == prev.offset && last.length == prev.length);
      if (prev.path == r.path && whole &&
          r.offset <= last.begin + last.length + kCoalesceGapBytes &&
          end - last.begin <= max_bytes) {
        last.ranges.push_back(i);
        last.length = end - last.begin;
        last.coalesced = true;
        ++parts[i];
        continue;
      }
    }
    for (int64_t b = 0; b < r.length; b += max_bytes) {
      gets.push_back({{i}, r.offset + b, std::min(max_bytes, r.length - b), false});
      ++parts[i];
    }
  }
  return gets;
}

// Performs one planned GET, copying coalesced bytes out to their ranges.
absl::Status RunGet(const StoreObjects& objects, absl::Span<const RangeRead> reads,
                    const ObjectGet& get, absl::Time deadline) {
  const RangeRead& first = reads[get.ranges[0]];
  if (!get.coalesced) {
    return objects.Read(first.path, get.begin,
                        absl::MakeSpan(static_cast<char*>(first.dest) + (get.begin - first.offset),
                                       static_cast<size_t>(get.length)),
                        deadline);
  }
  std::unique_ptr<char[]> buffer(new char[static_cast<size_t>(get.length)]);
  CKPT_RETURN_IF_ERROR(objects.Read(first.path, get.begin,
                                    absl::MakeSpan(buffer.get(), static_cast<size_t>(get.length)),
                                    deadline));
  for (size_t i : get.ranges) {
    const RangeRead& r = reads[i];
    std::memcpy(r.dest, buffer.get() + (r.offset - get.begin), static_cast<size_t>(r.length));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadObjectRanges(const StoreObjects& objects, absl::Span<const RangeRead> reads,
                              const IoOptions& io, absl::Time deadline) {
  const int64_t max_bytes = std::max<int64_t>(kMinObjectGetBytes, io.buffer_bytes);
  std::vector<int64_t> parts;
  const std::vector<ObjectGet> gets = PlanGets(reads, max_bytes, parts);
  std::unique_ptr<std::atomic<int64_t>[]> left(new std::atomic<int64_t>[reads.size()]);
  for (size_t i = 0; i < reads.size(); ++i) {
    left[i] = parts[i];
    if (parts[i] == 0) CKPT_RETURN_IF_ERROR(VerifyRange(objects, reads[i]));
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < gets.size();) {
      absl::Status s = RunGet(objects, reads, gets[j], deadline);
      // The thread that completes a range verifies it.
      for (size_t i : gets[j].ranges) {
        if (s.ok() && left[i].fetch_sub(1) == 1) s = VerifyRange(objects, reads[i]);
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        next = gets.size();
      }
    }
  };
  const size_t threads = std::min<size_t>(
      gets.size(), static_cast<size_t>(std::max(1, io.num_threads) * std::max(1, io.queue_depth)));
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
