// Compact rank descriptions on the wire (RankState.compact_tensors, issue 16): runs of tensors
// sharing one layout. The coordinator expands them to the pieces they stand for, and emitters
// (the worker, ckpt_loadgen) write a piece compactly only where the expansion gives back
// exactly that piece. The layout math is sharding/compact_layout's; this file converts between
// it and the protos.
#ifndef CKPT_PROTO_COMPACT_CONVERT_H_
#define CKPT_PROTO_COMPACT_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/coordinator.pb.h"
#include "sharding/compact_layout.h"

namespace ckpt {

// The piece tensor `i` of `run` stands for, for rank `rank` (errors name the tensor and rank):
// its TensorMeta, the region the run's layout gives and its replica id. InvalidArgument for a
// mesh index outside `meshes`, a placement that is neither Shard nor Replicate, no layout, and
// everything sharding/compact_layout refuses.
absl::StatusOr<pb::PieceMeta> ExpandCompactTensor(
    const pb::CompactTensors& run, int i,
    const google::protobuf::RepeatedPtrField<pb::CompactMesh>& meshes, int64_t rank);

// `state` with every run expanded and inserted at its index among `shards` (and into
// `memory_kinds` and `layouts` where those are parallel to `shards`; a compact DTensor's
// layout is its placements, flat_sharded with flat_over; a flat one's flat_sharded). Without
// runs returns &state and leaves `expanded` alone (no copy); otherwise fills `expanded` and
// returns it. InvalidArgument naming `who` (e.g. "job j rank 3") and the tensor for more than
// `max_pieces` pieces (listed and compact), a run outside the pieces or overlapping another,
// and any tensor ExpandCompactTensor refuses.
absl::StatusOr<const pb::RankState*> ExpandCompactTensors(const pb::RankState& state,
                                                          pb::RankState* expanded,
                                                          absl::string_view who,
                                                          int64_t max_pieces = kMaxRankPieces);

// Appends a rank's pieces to a RankState in order, each either listed (`shards`) or, where
// asked and exact, compactly (`compact_tensors`: a piece joins the run laid out as it is;
// meshes shared in `compact_meshes`).
class RankStateWriter {
 public:
  // `with_kinds_and_layouts`: keep `memory_kinds` and `layouts` parallel to the pieces (as the
  // worker sends them; runs carry their memory kind); otherwise neither is written and runs
  // have MEMORY_KIND_UNSPECIFIED (as ckpt_loadgen describes ranks).
  RankStateWriter(pb::RankState* state, bool with_kinds_and_layouts);

  // The worker's rule for a tensor as the trainer registered it: a DTensor (placements and a
  // mesh coordinate given) goes through AddDTensor, anything else is listed.
  void Add(const pb::PieceMeta& piece, pb::MemoryKind kind, const pb::TensorLayout& layout,
           absl::Span<const int64_t> mesh_shape, absl::Span<const int64_t> coordinate);
  // Lists `piece`.
  void AddPiece(const pb::PieceMeta& piece, pb::MemoryKind kind, const pb::TensorLayout& layout);
  // Describes `piece` as a DTensor with the layout's placements over `mesh_shape` at
  // `coordinate` (flat over mesh dim `flat_over` if given) when that expands to exactly
  // `piece`; otherwise lists it. Returns whether it went compact.
  bool AddDTensor(const pb::PieceMeta& piece, pb::MemoryKind kind, const pb::TensorLayout& layout,
                  absl::Span<const int64_t> mesh_shape, absl::Span<const int64_t> coordinate,
                  std::optional<int64_t> flat_over = std::nullopt);
  // Describes `piece` as part `part` of an even flat split into `parts` when that expands to
  // exactly `piece`; otherwise lists it. Returns whether it went compact.
  bool AddFlat(const pb::PieceMeta& piece, pb::MemoryKind kind, const pb::TensorLayout& layout,
               int64_t parts, int64_t part);

 private:
  int MeshIndex(absl::Span<const int64_t> shape, absl::Span<const int64_t> coordinate);
  // Appends `piece` to the run laid out as `run` (layout, replica id and memory kind; a new
  // one if none is); keeps it when its expansion gives back `piece` (and `layout`), else takes
  // it back and lists the piece.
  bool AddToRun(const pb::CompactTensors& run, const pb::PieceMeta& piece, pb::MemoryKind kind,
                const pb::TensorLayout& layout);

  pb::RankState* state_;
  bool with_kinds_and_layouts_;
  int32_t pieces_ = 0;
  // Each run's index in state_->compact_tensors by its serialized layout (a run without
  // tensors or indices).
  absl::flat_hash_map<std::string, int> run_of_layout_;
};

}  // namespace ckpt

#endif  // CKPT_PROTO_COMPACT_CONVERT_H_
