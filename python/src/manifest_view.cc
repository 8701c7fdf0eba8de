#include "python/src/manifest_view.h"

#include <nanobind/stl/string.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "python/src/errors.h"
#include "sharding/dtype.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"

namespace nb = nanobind;

namespace ckpt::python {

nb::dict ReadManifestDict(const std::string& path) {
  std::optional<pb::Manifest> manifest;
  {
    nb::gil_scoped_release release;
    const std::string manifest_path = absl::StrCat(path, "/manifest.pb");
    absl::StatusOr<std::string> bytes = ReadWholeFile(manifest_path, kMaxManifestBytes);
    if (!bytes.ok() && bytes.status().code() == absl::StatusCode::kNotFound) {
      throw StatusError{absl::NotFoundError(
          absl::StrCat("no committed checkpoint at ", path, " (", bytes.status().message(), ")"))};
    }
    manifest = ValueOrThrow(ParseManifest(ValueOrThrow(std::move(bytes)), manifest_path));
  }
  nb::dict tensors;
  for (const pb::TensorMeta& t : manifest->tensors()) {
    DType dtype = ValueOrThrow(DTypeFromProto(t.dtype()));
    nb::list shape;
    for (int64_t d : t.global_shape()) shape.append(d);
    tensors[nb::str(t.key().data(), t.key().size())] =
        nb::make_tuple(std::string(DTypeName(dtype)), shape);
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
