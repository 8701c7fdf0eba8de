#include "sharding/compact_layout.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sharding/flat_sharding.h"

namespace ckpt {
namespace {

absl::Status Refuse(const CompactSubject& subject, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", subject.key, " of rank ", subject.rank, ": compact layout ", what));
}

absl::Status Refuse(const CompactSubject& subject, const absl::Status& status) {
  return Refuse(subject, status.message());
}

// Sizes (not values) of the description's lists, checked before anything is computed.
absl::Status CheckCounts(const CompactSubject& subject, absl::Span<const int64_t> global_shape,
                         size_t mesh_dims, absl::Span<const int64_t> replica_id) {
  if (global_shape.size() > kMaxCompactDims || mesh_dims > kMaxCompactDims ||
      replica_id.size() > kMaxCompactDims) {
    return Refuse(subject, absl::StrCat("has more than ", kMaxCompactDims,
                                        " tensor dims, mesh dims or replica id entries"));
  }
  if (absl::StatusOr<int64_t> n = CheckedNumElements(global_shape); !n.ok()) {
    return Refuse(subject, n.status());
  }
  for (int64_t id : replica_id) {
    if (id < 0) return Refuse(subject, absl::StrCat("has negative replica id ", id));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DTensorExpander> DTensorExpander::Create(const CompactSubject& subject,
                                                        absl::Span<const int64_t> mesh_shape,
                                                        absl::Span<const int64_t> coordinate,
                                                        absl::Span<const Placement> placements,
                                                        absl::Span<const int64_t> replica_suffix,
                                                        std::optional<int64_t> flat_over) {
  if (absl::Status s = CheckCounts(subject, {}, mesh_shape.size(), replica_suffix); !s.ok()) {
    return s;
  }
  absl::StatusOr<DeviceMesh> mesh =
      DeviceMesh::Create(std::vector<int64_t>(mesh_shape.begin(), mesh_shape.end()));
  if (!mesh.ok()) return Refuse(subject, mesh.status());
  if (coordinate.size() != mesh_shape.size()) {
    return Refuse(subject, absl::StrCat("gives coordinate ", ShapeString(coordinate), " in ",
                                        mesh->DebugString()));
  }
  absl::StatusOr<int64_t> mesh_rank = mesh->Rank(coordinate);
  if (!mesh_rank.ok()) return Refuse(subject, mesh_rank.status());
  if (placements.size() != mesh_shape.size()) {
    return Refuse(subject, absl::StrCat("has placements ", PlacementsString(placements), " for ",
                                        mesh->DebugString()));
  }
  if (flat_over &&
      (*flat_over < 0 || *flat_over >= mesh->ndim() || placements[*flat_over].is_shard())) {
    return Refuse(subject,
                  absl::StrCat("is flat over mesh dim ", *flat_over,
                               ", which is not a Replicate() dim of ", mesh->DebugString()));
  }
  DTensorExpander out(*std::move(mesh), *mesh_rank);
  out.coordinate_.assign(coordinate.begin(), coordinate.end());
  out.placements_.assign(placements.begin(), placements.end());
  for (size_t d = 0; d < placements.size(); ++d) {
    if (!placements[d].is_shard() && static_cast<int64_t>(d) != flat_over) {
      out.replica_id_.push_back(coordinate[d]);
    }
  }
  out.replica_id_.insert(out.replica_id_.end(), replica_suffix.begin(), replica_suffix.end());
  out.flat_over_ = flat_over;
  return out;
}

absl::StatusOr<ExpandedPiece> DTensorExpander::Expand(
    const CompactSubject& subject, absl::Span<const int64_t> global_shape) const {
  if (absl::Status s = CheckCounts(subject, global_shape, 0, {}); !s.ok()) return s;
  absl::StatusOr<LocalShard> local =
      ComputeLocalShard(global_shape, mesh_, placements_, mesh_rank_);
  if (!local.ok()) return Refuse(subject, local.status());
  ExpandedPiece piece{local->region(), replica_id_};
  if (flat_over_) {
    absl::StatusOr<FlatRange> range = EvenFlatRange(
        piece.region.BoxElements(), mesh_.shape()[*flat_over_], coordinate_[*flat_over_]);
    if (!range.ok()) return Refuse(subject, range.status());
    piece.region.flat = *range;
  }
  return piece;
}

absl::StatusOr<ExpandedPiece> ExpandDTensorPiece(const CompactSubject& subject,
                                                 absl::Span<const int64_t> global_shape,
                                                 absl::Span<const int64_t> mesh_shape,
                                                 absl::Span<const int64_t> coordinate,
                                                 absl::Span<const Placement> placements,
                                                 absl::Span<const int64_t> replica_suffix,
                                                 std::optional<int64_t> flat_over) {
  absl::StatusOr<DTensorExpander> expander = DTensorExpander::Create(
      subject, mesh_shape, coordinate, placements, replica_suffix, flat_over);
  if (!expander.ok()) return expander.status();
  return expander->Expand(subject, global_shape);
}

absl::StatusOr<ExpandedPiece> ExpandFlatPiece(const CompactSubject& subject,
                                              absl::Span<const int64_t> global_shape, int64_t parts,
                                              int64_t part, absl::Span<const int64_t> replica_id) {
  if (absl::Status s = CheckCounts(subject, global_shape, 0, replica_id); !s.ok()) return s;
  if (parts < 1 || parts > kMaxWorldSize || part < 0 || part >= parts) {
    return Refuse(subject, absl::StrCat("gives flat part ", part, " of ", parts,
                                        " (needs 0 <= part < parts <= ", kMaxWorldSize, ")"));
  }
  absl::StatusOr<FlatRange> range = EvenFlatRange(*CheckedNumElements(global_shape), parts, part);
  if (!range.ok()) return Refuse(subject, range.status());
  ExpandedPiece piece{WholeRegion(global_shape),
                      std::vector<int64_t>(replica_id.begin(), replica_id.end())};
  piece.region.flat = *range;
  return piece;
}

}  // namespace ckpt
