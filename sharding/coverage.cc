#include "sharding/coverage.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

// A box in the coordinates of the squeezed tensor (dims of size 1 dropped): [lo, hi) per dim.
struct Box {
  std::vector<int64_t> lo, hi;
};

// The tensor with its size-1 dims dropped: they change neither row-major order nor indices.
struct Squeezed {
  std::vector<int> dims;        // original dim of each kept dim
  std::vector<int64_t> size;    // kept dims' sizes (each >= 2)
  std::vector<int64_t> stride;  // row-major strides in elements
};

Squeezed Squeeze(absl::Span<const int64_t> shape) {
  Squeezed s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    s.dims.push_back(static_cast<int>(i));
    s.size.push_back(shape[i]);
  }
  s.stride.assign(s.size.size(), 1);
  for (int i = static_cast<int>(s.size.size()) - 2; i >= 0; --i) {
    s.stride[i] = s.stride[i + 1] * s.size[i + 1];
  }
  return s;
}

// Appends the boxes (at most 2d - 1) whose union is the flat range [s, e) of the row-major
// flattening of `box` (squeezed coordinates), from dim k on; dims < k of `prefix` are fixed.
void DecomposeFlat(const Box& box, const std::vector<int64_t>& inner_size, int k, Box* prefix,
                   int64_t s, int64_t e, std::vector<Box>* out) {
  if (s >= e) return;
  const int d = static_cast<int>(box.lo.size());
  if (k == d || (s == 0 && e == inner_size[k])) {
    Box b = *prefix;
    for (int i = k; i < d; ++i) {
      b.lo[i] = box.lo[i];
      b.hi[i] = box.hi[i];
    }
    out->push_back(std::move(b));
    return;
  }
  const int64_t inner = inner_size[k + 1];
  int64_t a = s / inner;
  const int64_t z = e / inner;
  auto fix = [&](int64_t row) {
    prefix->lo[k] = box.lo[k] + row;
    prefix->hi[k] = box.lo[k] + row + 1;
  };
  if (a == z) {
    fix(a);
    DecomposeFlat(box, inner_size, k + 1, prefix, s - a * inner, e - a * inner, out);
    return;
  }
  if (s % inner != 0) {
    fix(a);
    DecomposeFlat(box, inner_size, k + 1, prefix, s % inner, inner, out);
    ++a;
  }
  if (a < z) {
    Box b = *prefix;
    b.lo[k] = box.lo[k] + a;
    b.hi[k] = box.lo[k] + z;
    for (int i = k + 1; i < d; ++i) {
      b.lo[i] = box.lo[i];
      b.hi[i] = box.hi[i];
    }
    out->push_back(std::move(b));
  }
  if (e % inner != 0) {
    fix(z);
    DecomposeFlat(box, inner_size, k + 1, prefix, 0, e % inner, out);
  }
}

// The boxes (squeezed coordinates) whose union is the region's elements; none when empty.
std::vector<Box> BoxesOf(const Region& r, const Squeezed& sq) {
  std::vector<Box> out;
  if (r.NumElements() == 0) return out;
  Box box;
  for (int dim : sq.dims) {
    box.lo.push_back(r.offsets[dim]);
    box.hi.push_back(r.offsets[dim] + r.lengths[dim]);
  }
  if (!r.flat || (r.flat->start == 0 && r.flat->stop == r.BoxElements())) {
    out.push_back(std::move(box));
    return out;
  }
  const int d = static_cast<int>(box.lo.size());
  std::vector<int64_t> inner_size(d + 1, 1);
  for (int i = d - 1; i >= 0; --i) inner_size[i] = inner_size[i + 1] * (box.hi[i] - box.lo[i]);
  Box prefix = box;
  DecomposeFlat(box, inner_size, 0, &prefix, r.flat->start, r.flat->stop, &out);
  return out;
}

// Appends the box's signed corner terms (row-major index of the corner) to plus / minus.
void AddCorners(const Box& b, const Squeezed& sq, std::vector<int64_t>* plus,
                std::vector<int64_t>* minus) {
  std::vector<int> cut;  // dims where the box ends before the tensor does
  int64_t base = 0;
  for (size_t i = 0; i < b.lo.size(); ++i) {
    base += b.lo[i] * sq.stride[i];
    if (b.hi[i] < sq.size[i]) cut.push_back(static_cast<int>(i));
  }
  const uint64_t n = uint64_t{1} << cut.size();
  for (uint64_t mask = 0; mask < n; ++mask) {
    int64_t index = base;
    int bits = 0;
    for (size_t j = 0; j < cut.size(); ++j) {
      if ((mask >> j) & 1) {
        const int i = cut[j];
        index += (b.hi[i] - b.lo[i]) * sq.stride[i];
        ++bits;
      }
    }
    (bits % 2 == 0 ? plus : minus)->push_back(index);
  }
}

int CutDims(const Box& b, const Squeezed& sq) {
  int n = 0;
  for (size_t i = 0; i < b.lo.size(); ++i) n += b.hi[i] < sq.size[i];
  return n;
}

// The row-major smallest element >= `target` inside the box, or `none` when there is none.
int64_t NextInBox(const Box& b, const Squeezed& sq, const std::vector<int64_t>& target,
                  int64_t none) {
  const int d = static_cast<int>(b.lo.size());
  int prefix = 0;  // target[0, prefix) lies inside the box
  while (prefix < d && target[prefix] >= b.lo[prefix] && target[prefix] < b.hi[prefix]) ++prefix;
  auto index = [&](int k, int64_t at_k) {  // target before k, at_k at k, box start after
    int64_t x = 0;
    for (int i = 0; i < d; ++i) {
      x += (i < k ? target[i] : (i == k ? at_k : b.lo[i])) * sq.stride[i];
    }
    return x;
  };
  if (prefix == d) return index(d, 0);
  for (int k = prefix; k >= 0; --k) {
    const int64_t v = std::max(b.lo[k], target[k] + 1);
    if (v < b.hi[k]) return index(k, v);
  }
  return none;
}

std::vector<int64_t> Unravel(int64_t index, absl::Span<const int64_t> shape) {
  std::vector<int64_t> c(shape.size(), 0);
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] > 0) {
      c[i] = index % shape[i];
      index /= shape[i];
    }
  }
  return c;
}

bool Contains(const Region& r, const std::vector<int64_t>& element) {
  int64_t local = 0;
  for (size_t i = 0; i < element.size(); ++i) {
    if (element[i] < r.offsets[i] || element[i] >= r.offsets[i] + r.lengths[i]) return false;
    local = local * r.lengths[i] + (element[i] - r.offsets[i]);
  }
  return !r.flat || (local >= r.flat->start && local < r.flat->stop);
}

std::string Coordinates(const std::vector<int64_t>& c) {
  return absl::StrCat("(", absl::StrJoin(c, ", "), c.size() == 1 ? ",)" : ")");
}

}  // namespace

int64_t CoverageTermBudget(int64_t num_pieces) {
  return std::min<int64_t>(num_pieces, int64_t{1} << 40) * 128 + (int64_t{1} << 22);
}

absl::StatusOr<std::optional<CoverageFault>> FindCoverageFault(absl::Span<const int64_t> shape,
                                                               absl::Span<const Region> pieces,
                                                               int64_t max_terms) {
  absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
  if (!numel.ok()) return numel.status();
  if (*numel == 0) return std::optional<CoverageFault>();  // nothing to store
  // The common case of one piece holding the whole tensor.
  if (pieces.size() == 1 && pieces[0].NumElements() == *numel) {
    return std::optional<CoverageFault>();
  }
  const Squeezed sq = Squeeze(shape);
  std::vector<std::vector<Box>> boxes(pieces.size());
  int64_t terms = 1;
  for (size_t p = 0; p < pieces.size(); ++p) {
    boxes[p] = BoxesOf(pieces[p], sq);
    for (const Box& b : boxes[p]) {
      const int cut = CutDims(b, sq);
      if (cut >= 40 || (int64_t{1} << cut) > max_terms - terms) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the pieces are cut along so many dimensions that checking their coverage needs "
            "more than ",
            max_terms, " terms (piece ", pieces[p].DebugString(), ")"));
      }
      terms += int64_t{1} << cut;
    }
  }
  std::vector<int64_t> plus, minus = {0};  // the tensor itself: -1 at the origin
  plus.reserve(terms / 2 + 1);
  minus.reserve(terms / 2 + 1);
  for (const auto& list : boxes) {
    for (const Box& b : list) AddCorners(b, sq, &plus, &minus);
  }
  std::sort(plus.begin(), plus.end());
  std::sort(minus.begin(), minus.end());
  // The smallest index whose terms do not cancel.
  size_t i = 0, j = 0;
  std::optional<int64_t> first;
  int64_t net = 0;
  while (i < plus.size() || j < minus.size()) {
    const int64_t v = std::min(i < plus.size() ? plus[i] : std::numeric_limits<int64_t>::max(),
                               j < minus.size() ? minus[j] : std::numeric_limits<int64_t>::max());
    int64_t count = 0;
    while (i < plus.size() && plus[i] == v) ++i, ++count;
    while (j < minus.size() && minus[j] == v) ++j, --count;
    if (count != 0) {
      first = v;
      net = count;
      break;
    }
  }
  if (!first) return std::optional<CoverageFault>();
  CoverageFault fault;
  fault.first = *first;
  fault.element = Unravel(*first, shape);
  fault.copies = 1 + net;
  fault.end = *first + 1;
  if (fault.copies == 0) {
    std::vector<int64_t> at;
    for (int dim : sq.dims) at.push_back(fault.element[dim]);
    fault.end = *numel;
    for (const auto& list : boxes) {
      for (const Box& b : list) fault.end = std::min(fault.end, NextInBox(b, sq, at, *numel));
    }
  } else {
    for (size_t p = 0; p < pieces.size() && fault.pieces.size() < 2; ++p) {
      if (pieces[p].NumElements() > 0 && Contains(pieces[p], fault.element)) {
        fault.pieces.push_back(static_cast<int>(p));
      }
    }
  }
  return std::optional<CoverageFault>(std::move(fault));
}

std::string DescribeCoverageFault(absl::string_view key, absl::Span<const int64_t> shape,
                                  const CoverageFault& fault,
                                  const std::function<std::string(int)>& piece_name) {
  const std::string tensor = absl::StrCat("tensor \"", key, "\" ", ShapeString(shape), ": ");
  if (fault.copies == 0) {
    if (fault.end == fault.first + 1) {
      return absl::StrCat(tensor, "element ", Coordinates(fault.element),
                          " is stored by no piece (a hole)");
    }
    return absl::StrCat(tensor, "elements [", fault.first, ", ", fault.end,
                        ") in row-major order are stored by no piece (a hole from ",
                        Coordinates(fault.element), " to ",
                        Coordinates(Unravel(fault.end - 1, shape)), ")");
  }
  std::vector<std::string> names;
  for (int p : fault.pieces) names.push_back(piece_name(p));
  return absl::StrCat(tensor, "element ", Coordinates(fault.element), " is stored by ",
                      fault.copies, " pieces (an overlap): ", absl::StrJoin(names, " and "));
}

absl::Status CheckExactCoverage(absl::string_view key, absl::Span<const int64_t> shape,
                                absl::Span<const Region> pieces) {
  absl::StatusOr<std::optional<CoverageFault>> fault =
      FindCoverageFault(shape, pieces, CoverageTermBudget(static_cast<int64_t>(pieces.size())));
  if (!fault.ok()) {
    return absl::Status(fault.status().code(),
                        absl::StrCat("tensor \"", key, "\": ", fault.status().message()));
  }
  if (!fault->has_value()) return absl::OkStatus();
  return absl::DataLossError(
      DescribeCoverageFault(key, shape, **fault, [&](int p) { return pieces[p].DebugString(); }));
}

std::optional<RunFault> FindRunTilingFault(std::vector<std::pair<int64_t, int64_t>> runs,
                                           int64_t total) {
  // Inside [0, total): runs clipped to it must follow each other without gap or overlap.
  std::sort(runs.begin(), runs.end());
  int64_t pos = 0;
  std::optional<int64_t> beyond;  // first element written past the end
  for (const auto& [offset, length] : runs) {
    if (length <= 0) continue;
    if (offset < 0) return RunFault{false, offset, offset + 1};
    if (offset + length > total) {
      const int64_t at = std::max(offset, total);
      beyond = std::min(beyond.value_or(at), at);
    }
    const int64_t end = std::min(offset + length, total);
    if (offset >= end) continue;
    if (offset > pos) return RunFault{true, pos, offset};
    if (offset < pos) return RunFault{false, offset, offset + 1};
    pos = end;
  }
  if (pos < total) return RunFault{true, pos, total};
  if (beyond) return RunFault{false, *beyond, *beyond + 1};
  return std::nullopt;
}

absl::Status RunTilingStatus(const std::optional<RunFault>& fault, absl::string_view what) {
  if (!fault) return absl::OkStatus();
  if (fault->hole) {
    return absl::NotFoundError(absl::StrCat("elements [", fault->offset, ", ", fault->end, ") of ",
                                            what, " are assembled from no stored piece"));
  }
  return absl::DataLossError(absl::StrCat("element ", fault->offset, " of ", what,
                                          " is assembled from more than one stored piece"));
}

}  // namespace ckpt
