#include "sharding/box_index.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace ckpt {
namespace {

bool IsEmpty(const Region& r) {
  for (int64_t len : r.lengths) {
    if (len == 0) return true;
  }
  return false;
}

// Whether a and b meet in every dim other than skip0 and skip1.
bool MeetInOtherDims(const Region& a, const Region& b, int skip0, int skip1) {
  for (int j = 0; j < a.ndim(); ++j) {
    if (j == skip0 || j == skip1) continue;
    if (a.offsets[j] >= b.offsets[j] + b.lengths[j] || b.offsets[j] >= a.offsets[j] + a.lengths[j])
      return false;
  }
  return true;
}

// Active intervals [start, end) on one axis, each with an id; finds all overlapping a query.
class ActiveIntervals {
 public:
  // `coords` holds every start and end that will be inserted; ids are in [0, max_id).
  ActiveIntervals(std::vector<int64_t> coords, int64_t max_id)
      : coords_(std::move(coords)), where_(max_id), start_of_(max_id) {
    std::sort(coords_.begin(), coords_.end());
    coords_.erase(std::unique(coords_.begin(), coords_.end()), coords_.end());
    leaves_ = coords_.size() > 1 ? coords_.size() - 1 : 1;
    nodes_.resize(4 * leaves_);
  }

  void Insert(int64_t id, int64_t start, int64_t end) {
    const int64_t lo = Index(start), hi = Index(end);
    AddRange(1, 0, leaves_, lo, hi, id);
    starts_.insert({start, id});
    start_of_[id] = start;
  }

  void Erase(int64_t id) {
    for (const auto& [node, pos] : where_[id]) {
      std::vector<int64_t>& items = nodes_[node];
      const int64_t moved = items.back();
      items[pos] = moved;
      items.pop_back();
      if (moved != id) {
        for (auto& entry : where_[moved]) {
          if (entry.first == node) {
            entry.second = pos;
            break;
          }
        }
      }
    }
    where_[id].clear();
    starts_.erase({start_of_[id], id});
  }

  // Calls f(id) for every active interval overlapping [a, b), a < b, each once.
  template <typename F>
  bool Query(int64_t a, int64_t b, F&& f) const {
    // Intervals containing a: stabbing query down the segment tree.
    if (coords_.size() > 1 && a >= coords_.front() && a < coords_.back()) {
      const int64_t leaf =
          std::upper_bound(coords_.begin(), coords_.end(), a) - coords_.begin() - 1;
      int64_t node = 1, lo = 0, hi = leaves_;
      while (true) {
        for (int64_t id : nodes_[node]) {
          if (!f(id)) return false;
        }
        if (hi - lo == 1) break;
        const int64_t mid = (lo + hi) / 2;
        if (leaf < mid) {
          node = 2 * node;
          hi = mid;
        } else {
          node = 2 * node + 1;
          lo = mid;
        }
      }
    }
    // Intervals starting in (a, b).
    for (auto it = starts_.upper_bound({a, INT64_MAX}); it != starts_.end() && it->first < b;
         ++it) {
      if (!f(it->second)) return false;
    }
    return true;
  }

 private:
  int64_t Index(int64_t x) const {
    return std::lower_bound(coords_.begin(), coords_.end(), x) - coords_.begin();
  }

  void AddRange(int64_t node, int64_t lo, int64_t hi, int64_t qlo, int64_t qhi, int64_t id) {
    if (qhi <= lo || hi <= qlo) return;
    if (qlo <= lo && hi <= qhi) {
      where_[id].push_back({node, static_cast<int64_t>(nodes_[node].size())});
      nodes_[node].push_back(id);
      return;
    }
    const int64_t mid = (lo + hi) / 2;
    AddRange(2 * node, lo, mid, qlo, qhi, id);
    AddRange(2 * node + 1, mid, hi, qlo, qhi, id);
  }

  std::vector<int64_t> coords_;
  int64_t leaves_ = 1;
  std::vector<std::vector<int64_t>> nodes_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> where_;  // id -> (node, position)
  std::set<std::pair<int64_t, int64_t>> starts_;                 // (start, id)
  std::vector<int64_t> start_of_;
};

// The box families of a sweep: family 1 is absent (count 1) when pairs within family 0 are
// wanted (`self`).
struct Families {
  absl::Span<const Region> fam[2];
  int count = 2;
  bool self = false;
};

// The number of dims of the non-empty boxes, or -1 when all are empty.
int CommonNdim(const Families& f) {
  int ndim = -1;
  for (int k = 0; k < f.count; ++k) {
    for (const Region& r : f.fam[k]) {
      if (!IsEmpty(r)) ndim = r.ndim();
    }
  }
  return ndim;
}

// The dims to sweep along and to index: the one with the most distinct box starts and the
// runner-up, so that candidates meeting in those two dims are (nearly) always real
// intersections.
std::pair<int, int> ChooseSweepDims(const Families& f, int ndim) {
  if (ndim <= 2) return {0, ndim > 1 ? 1 : 0};
  std::vector<std::pair<int64_t, int>> splits;  // (-distinct starts, dim)
  for (int j = 0; j < ndim; ++j) {
    std::vector<int64_t> starts;
    for (int k = 0; k < f.count; ++k) {
      for (const Region& r : f.fam[k]) {
        if (!IsEmpty(r)) starts.push_back(r.offsets[j]);
      }
    }
    std::sort(starts.begin(), starts.end());
    const int64_t distinct = std::unique(starts.begin(), starts.end()) - starts.begin();
    splits.push_back({-distinct, j});
  }
  std::sort(splits.begin(), splits.end());
  return {splits[0].second, splits[1].second};
}

// A box entering or leaving the sweep line: (x, kind (0 = end, 1 = start), family, id).
struct Event {
  int64_t x;
  int kind;
  int family;
  int64_t id;
};

// The non-empty boxes' events along dim d0, ends first at equal x (half-open).
std::vector<Event> SweepEvents(const Families& f, int d0) {
  std::vector<Event> events;
  for (int k = 0; k < f.count; ++k) {
    for (int64_t i = 0; i < static_cast<int64_t>(f.fam[k].size()); ++i) {
      const Region& r = f.fam[k][i];
      if (IsEmpty(r)) continue;
      events.push_back({r.offsets[d0], 1, k, i});
      events.push_back({r.offsets[d0] + r.lengths[d0], 0, k, i});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return std::tie(x.x, x.kind, x.family, x.id) < std::tie(y.x, y.kind, y.family, y.id);
  });
  return events;
}

// One-dimensional boxes: every active box of the other family overlaps a starting box.
// `report(family, mine, other)` returns false to stop.
template <typename Report>
void SweepLine(const Families& f, const std::vector<Event>& events, const Report& report) {
  std::vector<int64_t> active[2];
  std::vector<int64_t> pos[2];
  for (int k = 0; k < f.count; ++k) pos[k].assign(f.fam[k].size(), -1);
  for (const Event& e : events) {
    std::vector<int64_t>& mine = active[e.family];
    if (e.kind == 0) {
      const int64_t p = pos[e.family][e.id];
      pos[e.family][mine.back()] = p;
      mine[p] = mine.back();
      mine.pop_back();
      continue;
    }
    const int other = f.self ? 0 : 1 - e.family;
    for (int64_t o : active[other]) {
      if (!report(e.family, e.id, o)) return;
    }
    pos[e.family][e.id] = mine.size();
    mine.push_back(e.id);
  }
}

// Boxes of two or more dims: active boxes are indexed by their interval on dim d1, and
// candidates from the index are checked in the remaining dims.
template <typename Report>
void SweepIndexed(const Families& f, const std::vector<Event>& events, int ndim, int d0, int d1,
                  const Report& report) {
  std::vector<ActiveIntervals> index;
  for (int k = 0; k < f.count; ++k) {
    std::vector<int64_t> coords;
    for (const Region& r : f.fam[k]) {
      if (IsEmpty(r)) continue;
      coords.push_back(r.offsets[d1]);
      coords.push_back(r.offsets[d1] + r.lengths[d1]);
    }
    index.emplace_back(std::move(coords), f.fam[k].size());
  }
  for (const Event& e : events) {
    const Region& r = f.fam[e.family][e.id];
    if (e.kind == 0) {
      index[e.family].Erase(e.id);
      continue;
    }
    const int other = f.self ? 0 : 1 - e.family;
    const bool go_on =
        index[other].Query(r.offsets[d1], r.offsets[d1] + r.lengths[d1], [&](int64_t o) {
          if (ndim > 2 && !MeetInOtherDims(r, f.fam[other][o], d0, d1)) return true;
          return report(e.family, e.id, o);
        });
    if (!go_on) return;
    index[e.family].Insert(e.id, r.offsets[d1], r.offsets[d1] + r.lengths[d1]);
  }
}

// Sweep over one dim for two families (family 1 may be the same set as family 0 when `self`).
void Sweep(absl::Span<const Region> a, absl::Span<const Region> b, bool self,
           absl::FunctionRef<bool(int64_t, int64_t)> on_pair) {
  const Families f{{a, b}, self ? 1 : 2, self};
  const int ndim = CommonNdim(f);
  if (ndim < 0) return;
  if (ndim == 0) {
    for (int64_t i = 0; i < static_cast<int64_t>(a.size()); ++i) {
      for (int64_t j = self ? i + 1 : 0; j < static_cast<int64_t>(self ? a.size() : b.size()); ++j)
        if (!on_pair(i, j)) return;
    }
    return;
  }
  const auto [d0, d1] = ChooseSweepDims(f, ndim);
  auto report = [&](int family, int64_t mine, int64_t other) {
    if (self) return on_pair(std::min(mine, other), std::max(mine, other));
    return family == 0 ? on_pair(mine, other) : on_pair(other, mine);
  };
  const std::vector<Event> events = SweepEvents(f, d0);
  if (ndim == 1) {
    SweepLine(f, events, report);
  } else {
    SweepIndexed(f, events, ndim, d0, d1, report);
  }
}

}  // namespace

void ForEachIntersectingPair(absl::Span<const Region> a, absl::Span<const Region> b,
                             absl::FunctionRef<bool(int64_t, int64_t)> on_pair) {
  Sweep(a, b, /*self=*/false, on_pair);
}

void ForEachSelfIntersectingPair(absl::Span<const Region> boxes,
                                 absl::FunctionRef<bool(int64_t, int64_t)> on_pair) {
  Sweep(boxes, boxes, /*self=*/true, on_pair);
}

}  // namespace ckpt
