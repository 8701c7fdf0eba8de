#include "python/src/manifest_view.h"

#include <nanobind/stl/string.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/store_url.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "python/src/errors.h"
#include "sharding/dtype.h"
#include "storage/checkpoint_store.h"

namespace nb = nanobind;

namespace ckpt::python {
namespace {

// Manifests larger than this are refused (storage's own limit is 2 GiB; this view only lists
// tensors, and the coordinator validates the whole manifest again before any load).
constexpr std::streamoff kMaxManifestBytes = std::streamoff{1} << 31;
// How long reading the manifest of a checkpoint in an object store may take.
constexpr absl::Duration kStoreTimeout = absl::Minutes(2);

// The parsed manifest.pb of `path` (not validated beyond parsing: see the header). Its tensors,
// metadata and step are in manifest.pb in both manifest formats (format 2 keeps only its
// pieces in piece files beside it), so the piece files are never read here.
absl::StatusOr<pb::Manifest> ReadManifest(const std::string& path) {
  if (IsObjectStoreLocation(path)) {  // s3://...: the store's committed manifest
    absl::StatusOr<CheckpointStore*> store = StoreForUrl(path);
    if (!store.ok()) return store.status();
    absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored =
        (*store)->Open(path, absl::Now() + kStoreTimeout);
    if (!stored.ok()) return stored.status();
    return (*stored)->manifest();
  }
  const std::string file = absl::StrCat(path, "/manifest.pb");
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint at ", path, " (", file, ": ",
                                            std::strerror(errno), ")"));
  }
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", size, " bytes is not a manifest"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) {
    return absl::DataLossError(absl::StrCat(file, ": short read"));
  }
  pb::Manifest manifest;
  if (!manifest.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(file, " does not parse as a ckpt manifest"));
  }
  return manifest;
}

}  // namespace

nb::dict ReadManifestDict(const std::string& path) {
  std::optional<pb::Manifest> manifest;
  {
    nb::gil_scoped_release release;
    manifest = ValueOrThrow(ReadManifest(path));
  }
  nb::dict tensors;
  for (const pb::TensorMeta& t : manifest->tensors()) {
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      throw StatusError{absl::DataLossError(
          absl::StrCat(path, "/manifest.pb: tensor ", t.key(), ": ", dtype.status().message()))};
    }
    nb::list shape;
    for (int64_t d : t.global_shape()) shape.append(d);
    tensors[nb::str(t.key().data(), t.key().size())] =
        nb::make_tuple(std::string(DTypeName(*dtype)), shape);
  }
  nb::dict metadata;
  for (const auto& [k, v] : manifest->user_metadata()) {
    metadata[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
  }
  nb::dict out;
  out["tensors"] = tensors;
  out["metadata"] = metadata;
  out["step"] = manifest->step();
  return out;
}

}  // namespace ckpt::python
