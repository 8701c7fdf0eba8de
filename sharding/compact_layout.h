// Compact descriptions of one rank's piece of a tensor (issue 16): instead of the piece's
// region and replica id, a rank may give the layout it follows, and the coordinator expands it.
//  - DTensor: placements over a device mesh and the rank's coordinate in it. The region is the
//    one PyTorch's compute_local_shape_and_global_offset gives that coordinate (sharding/
//    dtensor's ComputeLocalShard: torch.chunk per Shard mesh dim, nested in placement order,
//    empty trailing chunks included); the replica id is the coordinates along the Replicate()
//    mesh dims followed by the description's own id, exactly as client::ResolveLayout (and so
//    ckpt.torch) computes it for a DTensorLayout.
//  - Flat (FSDP1 / ZeRO): the row-major flattening split torch.chunk-evenly into `parts`; the
//    rank holds part `part` (sharding/flat_sharding's EvenFlatRange); the replica id is the
//    description's own.
// Pure: no gRPC, threads or logging. Every input is checked; errors are InvalidArgument naming
// the tensor and the rank.
#ifndef CKPT_SHARDING_COMPACT_LAYOUT_H_
#define CKPT_SHARDING_COMPACT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/dtensor.h"
#include "sharding/region.h"

namespace ckpt {

// The most tensor dims, mesh dims and replica id entries a compact description may have.
inline constexpr int kMaxCompactDims = 64;
// The most pieces one rank may describe (listed and compact together): expansion allocates
// per piece, so a hostile count is refused before anything is built.
inline constexpr int64_t kMaxRankPieces = int64_t{1} << 22;

// What a compact description expands to: the rank's region and replica id.
struct ExpandedPiece {
  Region region;
  std::vector<int64_t> replica_id;
};

// Who a compact description belongs to, for error messages.
struct CompactSubject {
  absl::string_view key;
  int64_t rank = 0;
};

// A DTensor laid out with `placements` over a mesh of `mesh_shape`, seen from the rank at
// `coordinate`; `replica_suffix` is appended to the mesh's replica id. With `flat_over` (a
// Replicate() mesh dim), the box is then split into even flat ranges over that mesh dim, as a
// layout JSON's "flat": {"over": dim} does (planner/layout_spec: ZeRO-1 optimizer state), and
// that dim's coordinate leaves the replica id.
absl::StatusOr<ExpandedPiece> ExpandDTensorPiece(const CompactSubject& subject,
                                                 absl::Span<const int64_t> global_shape,
                                                 absl::Span<const int64_t> mesh_shape,
                                                 absl::Span<const int64_t> coordinate,
                                                 absl::Span<const Placement> placements,
                                                 absl::Span<const int64_t> replica_suffix,
                                                 std::optional<int64_t> flat_over = std::nullopt);

// A DTensor layout (mesh, coordinate, placements, replica suffix, flat_over as for
// ExpandDTensorPiece) checked once and expanded for many tensors: a run of a compact
// description. Expand(subject, shape) == ExpandDTensorPiece(subject, shape, <the layout>).
class DTensorExpander {
 public:
  // Errors name `subject` (the run's first tensor) and are those of ExpandDTensorPiece that
  // do not depend on the tensor.
  static absl::StatusOr<DTensorExpander> Create(const CompactSubject& subject,
                                                absl::Span<const int64_t> mesh_shape,
                                                absl::Span<const int64_t> coordinate,
                                                absl::Span<const Placement> placements,
                                                absl::Span<const int64_t> replica_suffix,
                                                std::optional<int64_t> flat_over);
  absl::StatusOr<ExpandedPiece> Expand(const CompactSubject& subject,
                                       absl::Span<const int64_t> global_shape) const;

 private:
  DTensorExpander(DeviceMesh mesh, int64_t mesh_rank)
      : mesh_(std::move(mesh)), mesh_rank_(mesh_rank) {}
  DeviceMesh mesh_;
  int64_t mesh_rank_;
  std::vector<int64_t> coordinate_;
  std::vector<Placement> placements_;
  std::vector<int64_t> replica_id_;  // the expanded pieces' (the same for every tensor)
  std::optional<int64_t> flat_over_;
};

// Part `part` of the even flat split of the tensor into `parts` parts (1 <= parts <=
// kMaxWorldSize, 0 <= part < parts).
absl::StatusOr<ExpandedPiece> ExpandFlatPiece(const CompactSubject& subject,
                                              absl::Span<const int64_t> global_shape, int64_t parts,
                                              int64_t part, absl::Span<const int64_t> replica_id);

}  // namespace ckpt

#endif  // CKPT_SHARDING_COMPACT_LAYOUT_H_
