// Overlaps between regions.
//
// The elements present in both src and dst lie in the intersection I of the two boxes. Walking I
// in its own row-major order visits strictly increasing box-flat indices of both the src box
// and the dst box, so each side's flat range selects a contiguous range of I's ordinals, and
// the elements present in both form one ordinal range [lo, hi). Runs are the maximal blocks of
// I that are contiguous in both boxes (the trailing dims that are full in I, src and dst,
// merged with the dim before them); the ordinal range cuts the first and last run.
#include "sharding/overlap.h"

#include <algorithm>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckpt {
namespace {

// Number of elements of `inter` (a sub-box of `box`) whose row-major flat index within `box`
// is below `t`, for 0 <= t <= box elements. Overflow-free: every product is bounded by the
// element count of `inter`.
int64_t CountBelow(const Region& inter, const Region& box, int64_t t) {
  const int n = box.ndim();
  const int64_t box_elems = box.BoxElements();
  int64_t inter_elems = inter.BoxElements();
  if (inter_elems == 0 || t <= 0) return 0;
  if (t >= box_elems) return inter_elems;
  // suffix[j] = elements of inter in dims > j; box_stride[j] likewise for box.
  absl::InlinedVector<int64_t, 8> suffix(n), box_stride(n);
  int64_t s = 1, b = 1;
  for (int j = n - 1; j >= 0; --j) {
    suffix[j] = s;
    box_stride[j] = b;
    s *= inter.lengths[j];
    b *= box.lengths[j];
  }
  int64_t count = 0;
  int64_t rem = t;
  for (int j = 0; j < n; ++j) {
    const int64_t digit = rem / box_stride[j];  // index of t along dim j of box
    rem %= box_stride[j];
    const int64_t lo = inter.offsets[j] - box.offsets[j];  // inter's extent in box coords
    const int64_t hi = lo + inter.lengths[j];
    const int64_t below = std::clamp<int64_t>(digit - lo, 0, inter.lengths[j]);
    count += below * suffix[j];
    if (digit < lo || digit >= hi) return count;
  }
  return count;  // t itself is an element of inter; it is not counted
}

// Range [lo, hi) of ordinals of `inter` (row-major within inter) whose elements are present
// in `side` (honouring its flat range).
std::pair<int64_t, int64_t> OrdinalRange(const Region& inter, const Region& side) {
  if (!side.flat) return {0, inter.BoxElements()};
  return {CountBelow(inter, side, side.flat->start), CountBelow(inter, side, side.flat->stop)};
}

// Everything OverlapRuns and OverlapElements share: the intersection box and the ordinal
// range of it present on both sides.
struct OverlapShape {
  Region inter;
  int64_t lo = 0;
  int64_t hi = 0;
};

absl::StatusOr<std::optional<OverlapShape>> ComputeOverlapShape(
    const Region& src, const Region& dst, absl::Span<const int64_t> global_shape) {
  CKPT_RETURN_IF_ERROR(ValidateRegion(src, global_shape));
  CKPT_RETURN_IF_ERROR(ValidateRegion(dst, global_shape));
  std::optional<Region> inter = IntersectBoxes(src, dst);
  if (!inter) return std::optional<OverlapShape>();
  auto [slo, shi] = OrdinalRange(*inter, src);
  auto [dlo, dhi] = OrdinalRange(*inter, dst);
  OverlapShape shape;
  shape.lo = std::max(slo, dlo);
  shape.hi = std::min(shi, dhi);
  if (shape.lo >= shape.hi) return std::optional<OverlapShape>();
  shape.inter = *std::move(inter);
  return std::optional<OverlapShape>(std::move(shape));
}

}  // namespace

std::optional<Region> IntersectBoxes(const Region& a, const Region& b) {
  if (a.ndim() != b.ndim() || a.offsets.size() != b.offsets.size()) return std::nullopt;
  const int n = a.ndim();
  Region out;
  out.offsets.resize(n);
  out.lengths.resize(n);
  for (int j = 0; j < n; ++j) {
    const int64_t lo = std::max(a.offsets[j], b.offsets[j]);
    const int64_t hi = std::min(a.offsets[j] + a.lengths[j], b.offsets[j] + b.lengths[j]);
    if (hi <= lo) return std::nullopt;
    out.offsets[j] = lo;
    out.lengths[j] = hi - lo;
  }
  return out;
}

absl::StatusOr<std::vector<CopyRun>> OverlapRuns(const Region& src, const Region& dst,
                                                 absl::Span<const int64_t> global_shape) {
  CKPT_ASSIGN_OR_RETURN(std::optional<OverlapShape> shape,
                        ComputeOverlapShape(src, dst, global_shape));
  std::vector<CopyRun> runs;
  if (!shape) return runs;
  const Region& inter = shape->inter;
  const int n = inter.ndim();

  // Strides of the src and dst boxes.
  absl::InlinedVector<int64_t, 8> src_stride(n), dst_stride(n);
  {
    int64_t s = 1, d = 1;
    for (int j = n - 1; j >= 0; --j) {
      src_stride[j] = s;
      dst_stride[j] = d;
      s *= src.lengths[j];
      d *= dst.lengths[j];
    }
  }
  // Dims [k, n) form one run: every dim after k is full in inter, src and dst.
  int k = n == 0 ? 0 : n - 1;
  while (k > 0 && inter.lengths[k] == src.lengths[k] && inter.lengths[k] == dst.lengths[k]) {
    --k;
  }
  int64_t run_len = 1;
  for (int j = k; j < n; ++j) run_len *= inter.lengths[j];

  const int64_t src_base = src.flat ? src.flat->start : 0;
  const int64_t dst_base = dst.flat ? dst.flat->start : 0;
  const int64_t first_run = shape->lo / run_len;
  const int64_t last_run = (shape->hi - 1) / run_len;
  runs.reserve(last_run - first_run + 1);

  // Odometer over dims [0, k) of inter, starting at run `first_run`; idx holds positions
  // relative to inter. Position along dim k (within the run) starts at inter's offset.
  absl::InlinedVector<int64_t, 8> idx(k);
  {
    int64_t r = first_run;
    for (int j = k - 1; j >= 0; --j) {
      idx[j] = r % inter.lengths[j];
      r /= inter.lengths[j];
    }
  }
  // Box-flat index of the run's first element in src / dst.
  auto box_flat = [&](const Region& box, const absl::InlinedVector<int64_t, 8>& stride) {
    int64_t f = 0;
    for (int j = 0; j < k; ++j) f += (inter.offsets[j] + idx[j] - box.offsets[j]) * stride[j];
    if (n > 0) f += (inter.offsets[k] - box.offsets[k]) * stride[k];
    return f;
  };
  int64_t src_pos = box_flat(src, src_stride);
  int64_t dst_pos = box_flat(dst, dst_stride);
  for (int64_t r = first_run; r <= last_run; ++r) {
    const int64_t begin = std::max(shape->lo, r * run_len);
    const int64_t end = std::min(shape->hi, (r + 1) * run_len);
    const int64_t skip = begin - r * run_len;
    const CopyRun run{src_pos + skip - src_base, dst_pos + skip - dst_base, end - begin};
    if (!runs.empty() && runs.back().src_offset + runs.back().length == run.src_offset &&
        runs.back().dst_offset + runs.back().length == run.dst_offset) {
      runs.back().length += run.length;
    } else {
      runs.push_back(run);
    }
    // Advance the odometer, updating positions incrementally.
    for (int j = k - 1; j >= 0; --j) {
      if (++idx[j] < inter.lengths[j]) {
        src_pos += src_stride[j];
        dst_pos += dst_stride[j];
        break;
      }
      idx[j] = 0;
      src_pos -= (inter.lengths[j] - 1) * src_stride[j];
      dst_pos -= (inter.lengths[j] - 1) * dst_stride[j];
    }
  }
  return runs;
}

absl::StatusOr<int64_t> OverlapElements(const Region& a, const Region& b,
                                        absl::Span<const int64_t> global_shape) {
  CKPT_ASSIGN_OR_RETURN(std::optional<OverlapShape> shape, ComputeOverlapShape(a, b, global_shape));
  if (!shape) return int64_t{0};
  return shape->hi - shape->lo;
}

void CopyRuns(absl::Span<const CopyRun> runs, int64_t elem_size, const void* src, void* dst) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (const CopyRun& run : runs) {
    if (run.length <= 0) continue;
    std::memmove(d + run.dst_offset * elem_size, s + run.src_offset * elem_size,
                 static_cast<size_t>(run.length * elem_size));
  }
}

}  // namespace ckpt
