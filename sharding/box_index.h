// Output-sensitive search for intersecting boxes, shared by layout validation and resharding
// plans: a sweep along one dim whose active boxes sit in an interval index on a second dim (a
// segment tree for "intervals containing a point" plus an ordered set for "intervals starting
// inside a range"). For boxes of up to 2 dims every candidate is a real intersection, so the
// cost is O((n + k) log n) for n boxes and k intersecting pairs. For more dims the sweep and
// index dims are the two along which the boxes are split most finely, and candidates are
// filtered on the remaining dims.
#ifndef CKPT_SHARDING_BOX_INDEX_H_
#define CKPT_SHARDING_BOX_INDEX_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "sharding/region.h"

namespace ckpt {

// Calls on_pair(i, j) once for every i in `a` and j in `b` whose boxes (offsets and lengths;
// flat ranges ignored) intersect. Boxes with a zero length never intersect anything. All
// boxes must have the same number of dims. on_pair returns false to stop the search.
void ForEachIntersectingPair(absl::Span<const Region> a, absl::Span<const Region> b,
                             absl::FunctionRef<bool(int64_t, int64_t)> on_pair);

// Calls on_pair(i, j) with i < j once for every two intersecting boxes of one set.
void ForEachSelfIntersectingPair(absl::Span<const Region> boxes,
                                 absl::FunctionRef<bool(int64_t, int64_t)> on_pair);

}  // namespace ckpt

#endif  // CKPT_SHARDING_BOX_INDEX_H_
