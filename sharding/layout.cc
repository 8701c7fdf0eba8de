#include "sharding/layout.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/box_index.h"
#include "sharding/flat_sharding.h"
#include "sharding/overlap.h"

namespace ckpt {
namespace {

std::string TensorName(absl::string_view key) { return absl::StrCat("tensor '", key, "'"); }

// Multi-index of global flat index `g` in `shape`, rendered "(i, j)".
std::string ElementString(absl::Span<const int64_t> shape, int64_t g) {
  std::vector<int64_t> idx(shape.size());
  for (int j = static_cast<int>(shape.size()) - 1; j >= 0; --j) {
    idx[j] = g % shape[j];
    g /= shape[j];
  }
  return ShapeString(idx);
}

// Elements of the (disjoint) boxes whose global flat index is below t.
int64_t CoveredBelow(absl::Span<const Region> boxes, absl::Span<const int64_t> shape, int64_t t) {
  if (t <= 0) return 0;
  const Region prefix = FlatRangeRegion(shape, FlatRange{0, t});
  int64_t n = 0;
  for (const Region& b : boxes) n += *OverlapElements(b, prefix, shape);
  return n;
}

}  // namespace

bool TensorPiece::is_main_replica() const {
  return std::all_of(replica_id.begin(), replica_id.end(), [](int64_t c) { return c == 0; });
}

std::string TensorPiece::DebugString() const {
  std::string s = absl::StrCat("rank ", rank, " ", region.DebugString());
  if (!is_main_replica()) absl::StrAppend(&s, " replica ", ShapeString(replica_id));
  return s;
}

std::vector<LayoutIssue> CheckTensorLayout(absl::Span<const TensorPiece> pieces, int max_issues) {
  std::vector<const TensorPiece*> ptrs;
  ptrs.reserve(pieces.size());
  for (const TensorPiece& p : pieces) ptrs.push_back(&p);
  return CheckTensorLayout(absl::Span<const TensorPiece* const>(ptrs), max_issues);
}

namespace {

// The issues found so far, at most `max` of them.
struct IssueList {
  std::vector<LayoutIssue> issues;
  int max = 0;
  // Records an issue unless the list is full; returns whether there is room for more.
  bool Add(LayoutIssue::Kind kind, std::string message) {
    if (static_cast<int>(issues.size()) < max) issues.push_back({kind, std::move(message)});
    return static_cast<int>(issues.size()) < max;
  }
};

// The disjoint boxes of a tensor's valid main replicas (flat ranges decomposed), with the piece
// index of each box, and the elements those replicas hold.
struct MainBoxes {
  std::vector<Region> boxes;
  std::vector<int64_t> owner;
  int64_t main_elements = 0;
};

// Per-piece checks against the reference piece's dtype and shape and the region's bounds;
// collects the valid main replicas' boxes. Returns false once the issue list is full.
bool CheckPieces(absl::Span<const TensorPiece* const> pieces, const TensorPiece& ref,
                 const std::string& name, IssueList* issues, MainBoxes* main) {
  const std::vector<int64_t>& shape = ref.global_shape;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = *pieces[i];
    if (p.dtype != ref.dtype) {
      if (!issues->Add(LayoutIssue::Kind::kDTypeMismatch,
                       absl::StrCat(name, ": rank ", p.rank, " reports dtype ", DTypeName(p.dtype),
                                    " but rank ", ref.rank, " reports ", DTypeName(ref.dtype))))
        return false;
      continue;
    }
    if (p.global_shape != shape) {
      if (!issues->Add(LayoutIssue::Kind::kShapeMismatch,
                       absl::StrCat(name, ": rank ", p.rank, " reports global shape ",
                                    ShapeString(p.global_shape), " but rank ", ref.rank,
                                    " reports ", ShapeString(shape))))
        return false;
      continue;
    }
    if (absl::Status s = ValidateRegion(p.region, shape); !s.ok()) {
      if (!issues->Add(LayoutIssue::Kind::kInvalidRegion,
                       absl::StrCat(name, ": rank ", p.rank, ": ", s.message())))
        return false;
      continue;
    }
    if (!p.is_main_replica()) continue;
    main->main_elements += p.region.NumElements();
    if (p.region.flat) {
      Region box = p.region;
      box.flat.reset();
      for (FlatSubBox& sub : FlatRangeToBoxes(box, *p.region.flat)) {
        main->boxes.push_back(std::move(sub.box));
        main->owner.push_back(i);
      }
    } else if (p.region.BoxElements() > 0) {
      main->boxes.push_back(p.region);
      main->owner.push_back(i);
    }
  }
  return true;
}

// Reports overlapping main replicas, one issue per pair of pieces. Returns whether any was
// found (or the list filled up).
bool ReportOverlaps(absl::Span<const TensorPiece* const> pieces, const MainBoxes& main,
                    absl::Span<const int64_t> shape, const std::string& name, IssueList* issues) {
  absl::flat_hash_set<std::pair<int64_t, int64_t>> seen;
  bool full = false;
  ForEachSelfIntersectingPair(main.boxes, [&](int64_t a, int64_t b) {
    const int64_t pa = std::min(main.owner[a], main.owner[b]);
    const int64_t pb = std::max(main.owner[a], main.owner[b]);
    if (!seen.insert({pa, pb}).second) return true;
    const int64_t shared = *OverlapElements(pieces[pa]->region, pieces[pb]->region, shape);
    full = !issues->Add(
        LayoutIssue::Kind::kOverlap,
        absl::StrCat(name, ": main replicas overlap in ", shared,
                     " elements: ", pieces[pa]->DebugString(), " and ", pieces[pb]->DebugString()));
    return !full;
  });
  return full || !seen.empty();
}

// Holes: with disjoint main replicas, missing = total - covered. The first hole is found by
// binary search on "the flat prefix [0, t) is fully covered" and reported.
void ReportFirstHole(const MainBoxes& main, absl::Span<const int64_t> shape,
                     const std::string& name, IssueList* issues) {
  const int64_t total = *CheckedNumElements(shape);
  if (main.main_elements >= total) return;
  int64_t lo = 0, hi = total;  // covered(lo) == lo, covered(hi) < hi
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (CoveredBelow(main.boxes, shape, mid) == mid ? lo : hi) = mid;
  }
  const int64_t hole_start = lo;
  // The hole ends where coverage resumes: largest t with covered(t) == covered(hole_start).
  const int64_t base = CoveredBelow(main.boxes, shape, hole_start);
  lo = hole_start + 1;
  hi = total + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (CoveredBelow(main.boxes, shape, mid) == base ? lo : hi) = mid;
  }
  const int64_t missing = total - main.main_elements;
  issues->Add(
      LayoutIssue::Kind::kHole,
      absl::StrCat(name, " of shape ", ShapeString(shape), ": ", missing,
                   " elements are held by no main replica; the first hole is flat elements [",
                   hole_start, ", ", lo, ") starting at element ",
                   ElementString(shape, hole_start)));
}

}  // namespace

std::vector<LayoutIssue> CheckTensorLayout(absl::Span<const TensorPiece* const> pieces,
                                           int max_issues) {
  IssueList issues;
  issues.max = max_issues;
  if (pieces.empty() || max_issues <= 0) return issues.issues;
  const TensorPiece* ref = pieces[0];
  for (const TensorPiece* p : pieces) {
    if (p->rank < ref->rank) ref = p;
  }
  const std::string name = TensorName(ref->key);
  const std::vector<int64_t>& shape = ref->global_shape;
  MainBoxes main;
  if (!CheckPieces(pieces, *ref, name, &issues, &main)) return issues.issues;
  if (ReportOverlaps(pieces, main, shape, name, &issues)) return issues.issues;
  ReportFirstHole(main, shape, name, &issues);
  return issues.issues;
}

absl::Status LayoutIssuesStatus(absl::Span<const std::string> messages, int max_issues) {
  if (messages.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid layout (", messages.size(),
                   static_cast<int64_t>(messages.size()) >= max_issues ? "+" : "",
                   " issues): ", absl::StrJoin(messages, "; ")));
}

absl::Status ValidateLayout(absl::Span<const TensorPiece> pieces, int max_issues) {
  // Grouped by key through pointers: copying every piece (key, shape, region) here was a
  // fifth of a 10k-rank save plan's allocations.
  std::map<absl::string_view, std::vector<const TensorPiece*>> by_key;
  for (const TensorPiece& p : pieces) by_key[p.key].push_back(&p);
  std::vector<std::string> messages;
  for (const auto& [key, group] : by_key) {
    const int left = max_issues - static_cast<int>(messages.size());
    if (left <= 0) break;
    for (LayoutIssue& issue :
         CheckTensorLayout(absl::Span<const TensorPiece* const>(group), left)) {
      messages.push_back(std::move(issue.message));
    }
  }
  return LayoutIssuesStatus(messages, max_issues);
}

}  // namespace ckpt
