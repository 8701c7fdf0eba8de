#include "sharding/region.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

int64_t Region::BoxElements() const {
  // A zero length first: shapes like (2^40, 2^40, 0) are valid and must not overflow.
  for (int64_t len : lengths) {
    if (len == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t len : lengths) n *= len;
  return n;
}

int64_t Region::NumElements() const { return flat ? flat->size() : BoxElements(); }

std::string Region::DebugString() const {
  std::vector<std::string> dims;
  dims.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    int64_t off = i < offsets.size() ? offsets[i] : 0;
    dims.push_back(absl::StrCat(off, ":", off + lengths[i]));
  }
  std::string out = absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
  if (flat) absl::StrAppend(&out, " flat[", flat->start, ":", flat->stop, ")");
  return out;
}

Region WholeRegion(absl::Span<const int64_t> global_shape) {
  Region r;
  r.offsets.assign(global_shape.size(), 0);
  r.lengths.assign(global_shape.begin(), global_shape.end());
  return r;
}

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  bool zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension ", shape[i], " at dim ", i,
                                                     " of shape ", ShapeString(shape)));
    }
    if (shape[i] == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t d : shape) {
    if (d > kMaxElements / n) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has more than 2^62 elements"));
    }
    n *= d;
  }
  return n;
}

absl::Status ValidateRegion(const Region& region, absl::Span<const int64_t> global_shape) {
  if (region.offsets.size() != region.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region has ", region.offsets.size(), " offsets but ", region.lengths.size(), " lengths"));
  }
  if (region.lengths.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", region.DebugString(), " has ", region.lengths.size(),
        " dims but the tensor shape ", ShapeString(global_shape), " has ", global_shape.size()));
  }
  auto total = CheckedNumElements(global_shape);
  if (!total.ok()) return total.status();
  for (size_t i = 0; i < global_shape.size(); ++i) {
    const int64_t off = region.offsets[i];
    const int64_t len = region.lengths[i];
    if (off < 0 || len < 0 || off > global_shape[i] || len > global_shape[i] - off) {
      return absl::InvalidArgumentError(absl::StrCat("region ", region.DebugString(),
                                                     " is out of bounds at dim ", i, " of shape ",
                                                     ShapeString(global_shape)));
    }
  }
  if (region.flat) {
    const int64_t box = region.BoxElements();
    if (region.flat->start < 0 || region.flat->start > region.flat->stop ||
        region.flat->stop > box) {
      return absl::InvalidArgumentError(
          absl::StrCat("flat range [", region.flat->start, ", ", region.flat->stop, ") of region ",
                       region.DebugString(), " is outside its box of ", box, " elements"));
    }
  }
  return absl::OkStatus();
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace ckpt
