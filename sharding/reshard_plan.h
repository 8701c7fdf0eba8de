// A resharding plan between two layouts of a set of tensors: for every destination piece,
// which source pieces hold its elements and the element runs that move them.
//
// The source layout must be complete (its main replicas cover every element of every tensor
// exactly once; see layout.h). Each destination element is taken from the one main-replica
// source piece that holds it, or, with prefer_local, from a replica of that piece with the
// same region on the destination piece's own rank. Overlaps are found with the sweep of
// box_index.h on flat ranges decomposed into boxes: O((pieces + overlaps) log pieces), never
// all pairs.
#ifndef CKPT_SHARDING_RESHARD_PLAN_H_
#define CKPT_SHARDING_RESHARD_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/layout.h"
#include "sharding/overlap.h"

namespace ckpt {

struct ReshardPlanOptions {
  // Check the source layout is complete and every destination piece names a known tensor
  // with the same dtype and shape and a valid region.
  bool validate = true;
  // Materialize each overlap's CopyRuns in the plan. Off by default: for row-parallel
  // weights of large models runs number in the tens of millions, so executors usually call
  // OverlapRunsOf() per overlap as they go.
  bool with_runs = false;
  // Read from a replica on the destination's rank when one holds the same region.
  bool prefer_local = true;
};

// Elements shared by one main-replica source region and one destination region (every
// destination replica with that region shares it).
struct ReshardOverlap {
  int64_t src_main_piece = 0;  // index into the source pieces
  int64_t dst_piece = 0;       // index of the first destination piece with this region
  int64_t elements = 0;
  std::vector<CopyRun> runs;  // src local -> dst local; empty unless with_runs
};

// Copy of one overlap's elements from one source piece into one destination piece.
struct ReshardTransfer {
  int64_t src_piece = 0;  // the main replica or, with prefer_local, a same-region replica
  int64_t dst_piece = 0;
  int64_t overlap = 0;  // index into ReshardPlan::overlaps
};

struct ReshardPlan {
  std::vector<ReshardOverlap> overlaps;    // by tensor key, then source piece, then dst piece
  std::vector<ReshardTransfer> transfers;  // by dst piece, then source local offset
  int64_t total_elements = 0;              // elements written into destination pieces
  int64_t local_elements = 0;              // ... of which read on the same rank
};

absl::StatusOr<ReshardPlan> PlanReshard(absl::Span<const TensorPiece> src,
                                        absl::Span<const TensorPiece> dst,
                                        const ReshardPlanOptions& options = {});

// The runs of one overlap (its stored runs, or computed now).
absl::StatusOr<std::vector<CopyRun>> OverlapRunsOf(const ReshardPlan& plan, int64_t overlap,
                                                   absl::Span<const TensorPiece> src,
                                                   absl::Span<const TensorPiece> dst);

// Executes the plan on host buffers: src_data[i] holds source piece i's elements (storage
// convention of overlap.h, DTypeSize bytes each), dst_data[j] receives destination piece j's.
absl::Status ApplyReshardPlan(const ReshardPlan& plan, absl::Span<const TensorPiece> src,
                              absl::Span<const TensorPiece> dst,
                              absl::Span<const void* const> src_data,
                              absl::Span<void* const> dst_data);

}  // namespace ckpt

#endif  // CKPT_SHARDING_RESHARD_PLAN_H_
