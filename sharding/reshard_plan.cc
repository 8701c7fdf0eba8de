#include "sharding/reshard_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "sharding/box_index.h"
#include "sharding/flat_sharding.h"

namespace ckpt {
namespace {

// Hashable view of a region, for grouping pieces with identical regions.
struct RegionKey {
  const Region* region;
  friend bool operator==(const RegionKey& a, const RegionKey& b) { return *a.region == *b.region; }
  template <typename H>
  friend H AbslHashValue(H h, const RegionKey& k) {
    h = H::combine(std::move(h), k.region->offsets, k.region->lengths, k.region->flat.has_value());
    if (k.region->flat) h = H::combine(std::move(h), k.region->flat->start, k.region->flat->stop);
    return h;
  }
};

// Appends the disjoint boxes holding a region's elements, tagged with `owner`.
void AppendBoxes(const Region& region, int64_t owner, std::vector<Region>* boxes,
                 std::vector<int64_t>* owners) {
  if (region.flat) {
    Region box = region;
    box.flat.reset();
    for (FlatSubBox& sub : FlatRangeToBoxes(box, *region.flat)) {
      boxes->push_back(std::move(sub.box));
      owners->push_back(owner);
    }
  } else if (region.BoxElements() > 0) {
    boxes->push_back(region);
    owners->push_back(owner);
  }
}

std::string Name(absl::string_view key) { return absl::StrCat("tensor '", key, "'"); }

// Checks that the tensor's source pieces cover it and that every destination piece agrees with
// the source's dtype and shape and lies inside it.
absl::Status ValidateTensor(absl::string_view key, absl::Span<const TensorPiece> src,
                            absl::Span<const TensorPiece> dst, const std::vector<int64_t>& src_ids,
                            const std::vector<int64_t>& dst_ids, const TensorPiece& ref) {
  const std::vector<int64_t>& shape = ref.global_shape;
  std::vector<const TensorPiece*> ptrs;
  ptrs.reserve(src_ids.size());
  for (int64_t i : src_ids) ptrs.push_back(&src[i]);
  std::vector<LayoutIssue> issues = CheckTensorLayout(ptrs, 8);
  if (!issues.empty()) {
    std::vector<std::string> messages;
    for (auto& issue : issues) messages.push_back(std::move(issue.message));
    return absl::InvalidArgumentError(
        absl::StrCat("source layout is not complete: ", absl::StrJoin(messages, "; ")));
  }
  for (int64_t j : dst_ids) {
    const TensorPiece& d = dst[j];
    if (d.dtype != ref.dtype || d.global_shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(key), ": destination rank ", d.rank, " expects ", DTypeName(d.dtype),
                       " ", ShapeString(d.global_shape), " but the source is ",
                       DTypeName(ref.dtype), " ", ShapeString(shape)));
    }
    if (absl::Status s = ValidateRegion(d.region, shape); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(key), ": destination rank ", d.rank, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// A tensor's source main replicas and, per main piece, the ranks holding a same-region replica
// (filled only when local replicas are preferred).
struct TensorSources {
  std::vector<int64_t> mains;
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> replica_on_rank;  // (main, rank)
};

TensorSources GroupSources(absl::Span<const TensorPiece> src, const std::vector<int64_t>& src_ids,
                           bool prefer_local) {
  TensorSources sources;
  absl::flat_hash_map<RegionKey, int64_t> main_of_region;
  for (int64_t i : src_ids) {
    if (src[i].is_main_replica()) {
      sources.mains.push_back(i);
      main_of_region.emplace(RegionKey{&src[i].region}, i);
    }
  }
  if (prefer_local) {
    for (int64_t i : src_ids) {
      auto it = main_of_region.find(RegionKey{&src[i].region});
      if (it != main_of_region.end())
        sources.replica_on_rank.emplace(std::make_pair(it->second, src[i].rank), i);
    }
  }
  return sources;
}

// The tensor's destination pieces grouped by distinct region.
std::vector<std::vector<int64_t>> GroupDestinations(absl::Span<const TensorPiece> dst,
                                                    const std::vector<int64_t>& dst_ids) {
  std::vector<std::vector<int64_t>> dst_groups;
  absl::flat_hash_map<RegionKey, int64_t> group_of_region;
  for (int64_t j : dst_ids) {
    auto [it, inserted] = group_of_region.emplace(RegionKey{&dst[j].region}, dst_groups.size());
    if (inserted) dst_groups.emplace_back();
    dst_groups[it->second].push_back(j);
  }
  return dst_groups;
}

// The (main index, destination group) pairs whose regions intersect, in the order of their
// (source piece, first destination piece), without duplicates.
std::vector<std::pair<int64_t, int64_t>> IntersectingPairs(
    absl::Span<const TensorPiece> src, absl::Span<const TensorPiece> dst,
    const std::vector<int64_t>& mains, const std::vector<std::vector<int64_t>>& dst_groups) {
  std::vector<Region> src_boxes, dst_boxes;
  std::vector<int64_t> src_owner, dst_owner;
  for (int64_t m = 0; m < static_cast<int64_t>(mains.size()); ++m) {
    AppendBoxes(src[mains[m]].region, m, &src_boxes, &src_owner);
  }
  for (int64_t g = 0; g < static_cast<int64_t>(dst_groups.size()); ++g) {
    AppendBoxes(dst[dst_groups[g][0]].region, g, &dst_boxes, &dst_owner);
  }
  std::vector<std::pair<int64_t, int64_t>> pairs;
  ForEachIntersectingPair(src_boxes, dst_boxes, [&](int64_t a, int64_t b) {
    pairs.emplace_back(src_owner[a], dst_owner[b]);
    return true;
  });
  std::sort(pairs.begin(), pairs.end(), [&](const auto& x, const auto& y) {
    return std::make_pair(mains[x.first], dst_groups[x.second][0]) <
           std::make_pair(mains[y.first], dst_groups[y.second][0]);
  });
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  return pairs;
}

// Plans one tensor: an overlap per intersecting (main piece, destination region) and a
// transfer per destination piece of that region, from a same-rank replica when preferred.
absl::Status PlanTensor(absl::string_view key, absl::Span<const TensorPiece> src,
                        absl::Span<const TensorPiece> dst, const std::vector<int64_t>& src_ids,
                        const std::vector<int64_t>& dst_ids, const ReshardPlanOptions& options,
                        ReshardPlan* plan) {
  int64_t ref = src_ids[0];
  for (int64_t i : src_ids) {
    if (src[i].rank < src[ref].rank) ref = i;
  }
  const std::vector<int64_t>& shape = src[ref].global_shape;
  if (options.validate)
    CKPT_RETURN_IF_ERROR(ValidateTensor(key, src, dst, src_ids, dst_ids, src[ref]));
  const TensorSources sources = GroupSources(src, src_ids, options.prefer_local);
  const std::vector<int64_t>& mains = sources.mains;
  const std::vector<std::vector<int64_t>> dst_groups = GroupDestinations(dst, dst_ids);
  for (const auto& [m, g] : IntersectingPairs(src, dst, mains, dst_groups)) {
    const TensorPiece& s = src[mains[m]];
    const TensorPiece& d = dst[dst_groups[g][0]];
    CKPT_ASSIGN_OR_RETURN(int64_t elements, OverlapElements(s.region, d.region, shape));
    if (elements == 0) continue;  // cannot happen for exact decompositions; be safe
    ReshardOverlap overlap;
    overlap.src_main_piece = mains[m];
    overlap.dst_piece = dst_groups[g][0];
    overlap.elements = elements;
    if (options.with_runs) {
      CKPT_ASSIGN_OR_RETURN(overlap.runs, OverlapRuns(s.region, d.region, shape));
    }
    const int64_t index = plan->overlaps.size();
    plan->overlaps.push_back(std::move(overlap));
    for (int64_t j : dst_groups[g]) {
      int64_t from = mains[m];
      if (options.prefer_local) {
        auto it = sources.replica_on_rank.find(std::make_pair(mains[m], dst[j].rank));
        if (it != sources.replica_on_rank.end()) from = it->second;
      }
      plan->transfers.push_back(ReshardTransfer{from, j, index});
      plan->total_elements += elements;
      if (src[from].rank == dst[j].rank) plan->local_elements += elements;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReshardPlan> PlanReshard(absl::Span<const TensorPiece> src,
                                        absl::Span<const TensorPiece> dst,
                                        const ReshardPlanOptions& options) {
  std::map<absl::string_view, std::vector<int64_t>> src_by_key, dst_by_key;
  for (int64_t i = 0; i < static_cast<int64_t>(src.size()); ++i)
    src_by_key[src[i].key].push_back(i);
  for (int64_t i = 0; i < static_cast<int64_t>(dst.size()); ++i)
    dst_by_key[dst[i].key].push_back(i);

  ReshardPlan plan;
  for (const auto& [key, dst_ids] : dst_by_key) {
    auto found = src_by_key.find(key);
    if (found == src_by_key.end()) {
      return absl::NotFoundError(absl::StrCat(Name(key), " is needed by destination ",
                                              dst[dst_ids[0]].DebugString(),
                                              " but no source piece holds it"));
    }
    CKPT_RETURN_IF_ERROR(PlanTensor(key, src, dst, found->second, dst_ids, options, &plan));
  }
  std::sort(plan.transfers.begin(), plan.transfers.end(),
            [](const ReshardTransfer& a, const ReshardTransfer& b) {
              return std::tie(a.dst_piece, a.src_piece, a.overlap) <
                     std::tie(b.dst_piece, b.src_piece, b.overlap);
            });
  return plan;
}

absl::StatusOr<std::vector<CopyRun>> OverlapRunsOf(const ReshardPlan& plan, int64_t overlap,
                                                   absl::Span<const TensorPiece> src,
                                                   absl::Span<const TensorPiece> dst) {
  if (overlap < 0 || overlap >= static_cast<int64_t>(plan.overlaps.size())) {
    return absl::InvalidArgumentError(absl::StrCat("overlap ", overlap, " is not in the plan"));
  }
  const ReshardOverlap& o = plan.overlaps[overlap];
  if (!o.runs.empty() || o.elements == 0) return o.runs;
  const TensorPiece& s = src[o.src_main_piece];
  return OverlapRuns(s.region, dst[o.dst_piece].region, s.global_shape);
}

absl::Status ApplyReshardPlan(const ReshardPlan& plan, absl::Span<const TensorPiece> src,
                              absl::Span<const TensorPiece> dst,
                              absl::Span<const void* const> src_data,
                              absl::Span<void* const> dst_data) {
  if (src_data.size() != src.size() || dst_data.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", src_data.size(), " source and ", dst_data.size(), " destination buffers for ",
        src.size(), " source and ", dst.size(), " destination pieces"));
  }
  std::vector<std::vector<CopyRun>> cache(plan.overlaps.size());
  std::vector<bool> cached(plan.overlaps.size(), false);
  for (const ReshardTransfer& t : plan.transfers) {
    if (!cached[t.overlap]) {
      CKPT_ASSIGN_OR_RETURN(cache[t.overlap], OverlapRunsOf(plan, t.overlap, src, dst));
      cached[t.overlap] = true;
    }
    CopyRuns(cache[t.overlap], DTypeSize(dst[t.dst_piece].dtype), src_data[t.src_piece],
             dst_data[t.dst_piece]);
  }
  return absl::OkStatus();
}

}  // namespace ckpt
