// The read side of a checkpoint in an object store (s3://bucket/prefix; storage/s3_store.h lays
// it out), for the read paths that take a checkpoint location: CheckpointReader::Open and
// OpenShare, and the coordinator's load planning. A reader reads only its byte ranges, as ranged
// GETs in parallel, verified as storage/io_engine.h verifies file ranges.
//
// Why not CheckpointStore::Open: that GETs the whole manifest, and a worker of a cluster load
// holds only the share the coordinator sent it. The share carries Manifest.object_generation (the
// prefix under which the committed write put its data objects), so a worker reads exactly the
// objects the coordinator planned on, without one GET of the manifest per worker.
//
// The client is made once per process from the AWS environment (as the registry's "s3" store
// is: storage/s3/s3_credentials.h, AWS_CA_BUNDLE, CKPT_S3_ADDRESSING).
#ifndef CKPT_STORAGE_STORE_OBJECTS_H_
#define CKPT_STORAGE_STORE_OBJECTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/store_url.h"  // IsObjectStoreLocation
#include "proto/manifest.pb.h"
#include "storage/io_engine.h"

namespace ckpt {

class S3Client;

// The manifest committed at object-store URL `url` (one GET of the manifest object), validated,
// with its object_generation kept. NotFound naming the URL when none is committed; DataLoss
// naming the manifest object when it does not parse or validate or names no valid generation;
// InvalidArgument naming the URL for a scheme other than s3 or a URL that is not valid.
absl::StatusOr<pb::Manifest> ReadStoreManifest(const std::string& url, absl::Time deadline);

// The data objects of the checkpoint committed at an object-store URL. Thread-safe.
class StoreObjects {
 public:
  // The objects of the checkpoint at `url` whose manifest (or share of one) is `manifest`:
  // those under its object_generation. Sends no request. InvalidArgument naming the URL for a
  // scheme other than s3, a URL that is not valid or a manifest naming no valid generation.
  static absl::StatusOr<std::unique_ptr<StoreObjects>> Open(const std::string& url,
                                                            const pb::Manifest& manifest);

  const std::string& url() const { return url_; }
  // The URL of object `name` ("s3://bucket/prefix/<generation>/data/r0_0.safetensors").
  std::string Describe(absl::string_view name) const;
  // The size of object `name` (a HEAD): NotFound naming the object when it is missing.
  absl::StatusOr<int64_t> Size(absl::string_view name, absl::Time deadline) const;
  // Copies bytes [offset, offset + dest.size()) of object `name` into `dest` (a ranged GET):
  // NotFound naming it when missing, DataLoss naming it when it holds fewer bytes.
  absl::Status Read(absl::string_view name, int64_t offset, absl::Span<char> dest,
                    absl::Time deadline) const;

 private:
  StoreObjects() = default;
  std::string url_;
  S3Client* client_ = nullptr;  // the process's; never deleted
  std::string bucket_;
  std::string key_prefix_;  // "<prefix>/<generation>/"
};

// Every data file `manifest` lists is an object of its recorded size (a HEAD each): NotFound
// naming the object when it is missing, DataLoss naming it ("truncated" when shorter) otherwise.
absl::Status CheckObjectSizes(const StoreObjects& objects, const pb::Manifest& manifest,
                              absl::Time deadline);

// The smallest GET ReadObjectRanges makes of ranges it coalesces or cuts: an object store
// answers each request in tens of milliseconds (a Swift proxy reading a multipart object's
// segments, more), so a file-sized transfer (io.buffer_bytes) would make a load a long series
// of round trips.
inline constexpr int64_t kMinObjectGetBytes = int64_t{16} << 20;

// ReadRanges (storage/io_engine.h) for objects: each read's `path` is an object name of
// `objects`. Ranges of one object lying within 4 MiB of each other are fetched by one GET
// (coalesced, as s3torchconnector's reader does: many small pieces cost one round trip, not
// one each) while it stays within max(kMinObjectGetBytes, io.buffer_bytes); longer ranges are
// cut into GETs of that size. The GETs run on up to io.num_threads * io.queue_depth threads, and
// each range is verified once all its bytes are in place: a mismatch is DataLoss naming the read's
// label and the object. The first error wins.
absl::Status ReadObjectRanges(const StoreObjects& objects, absl::Span<const RangeRead> reads,
                              const IoOptions& io, absl::Time deadline);

}  // namespace ckpt

#endif  // CKPT_STORAGE_STORE_OBJECTS_H_
