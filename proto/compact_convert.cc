#include "proto/compact_convert.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/compact_layout.h"
#include "sharding/dtensor.h"

namespace ckpt {
namespace {

template <typename T>
absl::Span<const int64_t> Ints(const T& repeated) {
  return absl::MakeConstSpan(repeated.data(), repeated.size());
}

absl::Status Refuse(absl::string_view key, int64_t rank, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", key, " of rank ", rank, ": ", what));
}

absl::StatusOr<std::vector<Placement>> PlacementsFromProto(const pb::CompactDTensor& dtensor,
                                                           absl::string_view key, int64_t rank) {
  if (dtensor.placements_size() > kMaxCompactDims) {
    return Refuse(key, rank, absl::StrCat("more than ", kMaxCompactDims, " placements"));
  }
  std::vector<Placement> out;
  out.reserve(dtensor.placements_size());
  for (int i = 0; i < dtensor.placements_size(); ++i) {
    const pb::Placement& p = dtensor.placements(i);
    if (p.kind_case() == pb::Placement::kShardDim) {
      out.push_back(Placement::Shard(p.shard_dim()));
    } else if (p.kind_case() == pb::Placement::kReplicate) {
      out.push_back(Placement::Replicate());
    } else {
      return Refuse(key, rank, absl::StrCat("placement ", i, " is neither Shard nor Replicate"));
    }
  }
  return out;
}

pb::TensorLayout LayoutOf(const pb::CompactTensor& tensor) {
  pb::TensorLayout layout;
  layout.set_key(tensor.tensor().key());
  if (tensor.has_dtensor()) {
    *layout.mutable_placements() = tensor.dtensor().placements();
    layout.set_flat_sharded(tensor.dtensor().has_flat_over());
  } else {
    layout.set_flat_sharded(true);
  }
  return layout;
}

bool SamePiece(const pb::PieceMeta& a, const pb::PieceMeta& b) {
  return a.tensor().SerializeAsString() == b.tensor().SerializeAsString() &&
         a.region().SerializeAsString() == b.region().SerializeAsString() &&
         std::equal(a.replica_id().begin(), a.replica_id().end(), b.replica_id().begin(),
                    b.replica_id().end());
}

// For every piece position, the compact tensor placed there (-1: the next listed shard).
absl::StatusOr<std::vector<int>> CompactSlots(const pb::RankState& state, absl::string_view who,
                                              int64_t max_pieces) {
  const int64_t total = int64_t{state.shards_size()} + state.compact_tensors_size();
  if (total > max_pieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " describes ", total, " pieces; at most ", max_pieces));
  }
  std::vector<int> slots(total, -1);
  for (int i = 0; i < state.compact_tensors_size(); ++i) {
    const pb::CompactTensor& t = state.compact_tensors(i);
    if (t.index() < 0 || t.index() >= total || slots[t.index()] != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": compact tensor ", t.tensor().key(), " has index ", t.index(),
                       t.index() >= 0 && t.index() < total ? ", already taken by another" : "",
                       " among its ", total, " pieces"));
    }
    slots[t.index()] = i;
  }
  return slots;
}

}  // namespace

absl::StatusOr<pb::PieceMeta> ExpandCompactTensor(
    const pb::CompactTensor& tensor,
    const google::protobuf::RepeatedPtrField<pb::CompactMesh>& meshes, int64_t rank) {
  const std::string& key = tensor.tensor().key();
  const CompactSubject subject{key, rank};
  absl::StatusOr<ExpandedPiece> piece;
  if (tensor.has_dtensor()) {
    const int mesh = tensor.dtensor().mesh();
    if (mesh < 0 || mesh >= meshes.size()) {
      return Refuse(key, rank,
                    absl::StrCat("mesh ", mesh, " is not among the rank's ", meshes.size(),
                                 " compact meshes"));
    }
    absl::StatusOr<std::vector<Placement>> placements =
        PlacementsFromProto(tensor.dtensor(), key, rank);
    if (!placements.ok()) return placements.status();
    piece = ExpandDTensorPiece(
        subject, Ints(tensor.tensor().global_shape()), Ints(meshes[mesh].shape()),
        Ints(meshes[mesh].coordinate()), *placements, Ints(tensor.replica_id()),
        tensor.dtensor().has_flat_over() ? std::optional<int64_t>(tensor.dtensor().flat_over())
                                         : std::nullopt);
  } else if (tensor.has_flat()) {
    piece = ExpandFlatPiece(subject, Ints(tensor.tensor().global_shape()), tensor.flat().parts(),
                            tensor.flat().part(), Ints(tensor.replica_id()));
  } else {
    return Refuse(key, rank, "compact tensor without a DTensor or flat layout");
  }
  if (!piece.ok()) return piece.status();
  pb::PieceMeta out;
  *out.mutable_tensor() = tensor.tensor();
  *out.mutable_region() = RegionToProto(piece->region);
  out.mutable_replica_id()->Add(piece->replica_id.begin(), piece->replica_id.end());
  return out;
}

absl::StatusOr<const pb::RankState*> ExpandCompactTensors(const pb::RankState& state,
                                                          pb::RankState* expanded,
                                                          absl::string_view who,
                                                          int64_t max_pieces) {
  if (state.compact_tensors_size() == 0) return &state;
  absl::StatusOr<std::vector<int>> slots = CompactSlots(state, who, max_pieces);
  if (!slots.ok()) return slots.status();
  const bool kinds = state.memory_kinds_size() == state.shards_size();
  const bool layouts = state.layouts_size() == state.shards_size();
  expanded->Clear();
  expanded->set_rank(state.rank());
  *expanded->mutable_mesh_shape() = state.mesh_shape();
  if (!kinds) *expanded->mutable_memory_kinds() = state.memory_kinds();
  if (!layouts) *expanded->mutable_layouts() = state.layouts();
  int listed = 0;
  for (int slot : *slots) {
    if (slot < 0) {
      if (kinds) expanded->add_memory_kinds(state.memory_kinds(listed));
      if (layouts) *expanded->add_layouts() = state.layouts(listed);
      *expanded->add_shards() = state.shards(listed++);
      continue;
    }
    const pb::CompactTensor& t = state.compact_tensors(slot);
    absl::StatusOr<pb::PieceMeta> piece =
        ExpandCompactTensor(t, state.compact_meshes(), state.rank());
    if (!piece.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", piece.status().message()));
    }
    *expanded->add_shards() = *std::move(piece);
    if (kinds) expanded->add_memory_kinds(t.memory_kind());
    if (layouts) *expanded->add_layouts() = LayoutOf(t);
  }
  return expanded;
}

RankStateWriter::RankStateWriter(pb::RankState* state, bool with_kinds_and_layouts)
    : state_(state), with_kinds_and_layouts_(with_kinds_and_layouts) {}

void RankStateWriter::Add(const pb::PieceMeta& piece, pb::MemoryKind kind,
                          const pb::TensorLayout& layout, absl::Span<const int64_t> mesh_shape,
                          absl::Span<const int64_t> coordinate) {
  if (layout.placements_size() > 0 && !coordinate.empty()) {
    AddDTensor(piece, kind, layout, mesh_shape, coordinate);
  } else {
    AddPiece(piece, kind, layout);
  }
}

void RankStateWriter::AddPiece(const pb::PieceMeta& piece, pb::MemoryKind kind,
                               const pb::TensorLayout& layout) {
  *state_->add_shards() = piece;
  if (with_kinds_and_layouts_) {
    state_->add_memory_kinds(kind);
    *state_->add_layouts() = layout;
  }
  ++pieces_;
}

int RankStateWriter::MeshIndex(absl::Span<const int64_t> shape,
                               absl::Span<const int64_t> coordinate) {
  for (int i = 0; i < state_->compact_meshes_size(); ++i) {
    const pb::CompactMesh& m = state_->compact_meshes(i);
    if (Ints(m.shape()) == shape && Ints(m.coordinate()) == coordinate) return i;
  }
  pb::CompactMesh* added = state_->add_compact_meshes();
  added->mutable_shape()->Add(shape.begin(), shape.end());
  added->mutable_coordinate()->Add(coordinate.begin(), coordinate.end());
  return state_->compact_meshes_size() - 1;
}

bool RankStateWriter::AddDTensor(const pb::PieceMeta& piece, pb::MemoryKind kind,
                                 const pb::TensorLayout& layout,
                                 absl::Span<const int64_t> mesh_shape,
                                 absl::Span<const int64_t> coordinate,
                                 std::optional<int64_t> flat_over) {
  const int meshes_before = state_->compact_meshes_size();
  // The mesh's own replica id is the coordinates along the Replicate() dims (but flat_over);
  // what follows them in the piece's id is the description's own.
  int64_t mesh_ids = flat_over ? -1 : 0;
  for (const pb::Placement& p : layout.placements()) mesh_ids += p.has_replicate() ? 1 : 0;
  if (mesh_ids > piece.replica_id_size()) {
    AddPiece(piece, kind, layout);
    return false;
  }
  pb::CompactTensor* t = state_->add_compact_tensors();
  *t->mutable_tensor() = piece.tensor();
  t->set_index(pieces_);
  t->mutable_dtensor()->set_mesh(MeshIndex(mesh_shape, coordinate));
  *t->mutable_dtensor()->mutable_placements() = layout.placements();
  if (flat_over) t->mutable_dtensor()->set_flat_over(static_cast<int32_t>(*flat_over));
  t->mutable_replica_id()->Add(piece.replica_id().begin() + mesh_ids, piece.replica_id().end());
  t->set_memory_kind(kind);
  if (KeepIfExact(piece, kind, layout)) return true;
  while (state_->compact_meshes_size() > meshes_before)
    state_->mutable_compact_meshes()->RemoveLast();
  return false;
}

bool RankStateWriter::AddFlat(const pb::PieceMeta& piece, pb::MemoryKind kind,
                              const pb::TensorLayout& layout, int64_t parts, int64_t part) {
  pb::CompactTensor* t = state_->add_compact_tensors();
  *t->mutable_tensor() = piece.tensor();
  t->set_index(pieces_);
  t->mutable_flat()->set_parts(parts);
  t->mutable_flat()->set_part(part);
  *t->mutable_replica_id() = piece.replica_id();
  t->set_memory_kind(kind);
  return KeepIfExact(piece, kind, layout);
}

bool RankStateWriter::KeepIfExact(const pb::PieceMeta& piece, pb::MemoryKind kind,
                                  const pb::TensorLayout& layout) {
  const pb::CompactTensor& compact = state_->compact_tensors(state_->compact_tensors_size() - 1);
  absl::StatusOr<pb::PieceMeta> expanded =
      ExpandCompactTensor(compact, state_->compact_meshes(), state_->rank());
  // The expansion must also give back the layout the coordinator keeps for the manifest.
  const bool exact = expanded.ok() && SamePiece(*expanded, piece) &&
                     (!with_kinds_and_layouts_ ||
                      LayoutOf(compact).SerializeAsString() == layout.SerializeAsString());
  if (!exact) {
    state_->mutable_compact_tensors()->RemoveLast();
    AddPiece(piece, kind, layout);
    return false;
  }
  ++pieces_;
  return true;
}

}  // namespace ckpt
