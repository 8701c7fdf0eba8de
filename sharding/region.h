// Regions of a global tensor: an N-d box, optionally restricted to a flat range of its
// row-major flattening (Megatron's flattened_range, ZeRO/FSDP flat shards).
#ifndef CKPT_SHARDING_REGION_H_
#define CKPT_SHARDING_REGION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt {

// Largest element count of any tensor or box we accept (2^62), so that byte sizes of
// 8-byte dtypes never overflow int64 arithmetic in callers that multiply by 2.
inline constexpr int64_t kMaxElements = int64_t{1} << 62;

// Half-open range [start, stop) of element indices.
struct FlatRange {
  int64_t start = 0;
  int64_t stop = 0;

  int64_t size() const { return stop - start; }
  friend bool operator==(const FlatRange& a, const FlatRange& b) {
    return a.start == b.start && a.stop == b.stop;
  }
  friend bool operator!=(const FlatRange& a, const FlatRange& b) { return !(a == b); }
};

// A box (offsets, lengths) of a global tensor, optionally narrowed to the flat range
// `flat` of the box's row-major flattening. A 0-d tensor has empty offsets and lengths.
struct Region {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  std::optional<FlatRange> flat;

  int ndim() const { return static_cast<int>(lengths.size()); }
  // Elements of the box (product of lengths; 1 for 0-d). Assumes a validated region.
  int64_t BoxElements() const;
  // Elements actually held: the flat range's size when present, else BoxElements().
  int64_t NumElements() const;
  // E.g. "[0:4, 8:16]" or "[0:4, 8:16] flat[3:40)".
  std::string DebugString() const;

  friend bool operator==(const Region& a, const Region& b) {
    return a.offsets == b.offsets && a.lengths == b.lengths && a.flat == b.flat;
  }
  friend bool operator!=(const Region& a, const Region& b) { return !(a == b); }
};

// The whole of a tensor of the given shape.
Region WholeRegion(absl::Span<const int64_t> global_shape);

// Product of dims, or InvalidArgument if any is negative or the product exceeds kMaxElements.
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape);

// Checks the region lies inside `global_shape`: matching ranks, non-negative offsets and
// lengths, offset + length <= dim, element counts <= kMaxElements, and a flat range with
// 0 <= start <= stop <= BoxElements(). Messages name the offending dimension.
absl::Status ValidateRegion(const Region& region, absl::Span<const int64_t> global_shape);

// "(8, 4)" style rendering of a shape.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace ckpt

#endif  // CKPT_SHARDING_REGION_H_
