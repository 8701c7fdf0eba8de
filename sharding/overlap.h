// Overlaps between regions and the element runs that copy one region's data into another's.
//
// Storage convention used everywhere in ckpt: a piece with region R holds its elements as the
// row-major flattening of R's box, restricted to R.flat when present; local element index i
// is box-flat index (R.flat ? R.flat->start : 0) + i.
#ifndef CKPT_SHARDING_OVERLAP_H_
#define CKPT_SHARDING_OVERLAP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/region.h"

namespace ckpt {

// Copy `length` consecutive elements from local index `src_offset` of the source piece to
// local index `dst_offset` of the destination piece.
struct CopyRun {
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  int64_t length = 0;

  friend bool operator==(const CopyRun& a, const CopyRun& b) {
    return a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length;
  }
};

// Intersection of the boxes of a and b (flat ranges ignored); nullopt when it is empty.
// Both must have the same number of dims.
std::optional<Region> IntersectBoxes(const Region& a, const Region& b);

// The runs (in increasing dst_offset order, adjacent runs merged) that copy every element
// present in both `src` and `dst` (honouring flat ranges on either side) from src storage to
// dst storage. Empty when they do not overlap. Both regions must be valid for global_shape.
absl::StatusOr<std::vector<CopyRun>> OverlapRuns(const Region& src, const Region& dst,
                                                 absl::Span<const int64_t> global_shape);

// Number of elements present in both regions (sum of OverlapRuns lengths), computed
// without materializing runs.
absl::StatusOr<int64_t> OverlapElements(const Region& a, const Region& b,
                                        absl::Span<const int64_t> global_shape);

// Executes runs on host buffers with elements of `elem_size` bytes (any size >= 1).
void CopyRuns(absl::Span<const CopyRun> runs, int64_t elem_size, const void* src, void* dst);

}  // namespace ckpt

#endif  // CKPT_SHARDING_OVERLAP_H_
