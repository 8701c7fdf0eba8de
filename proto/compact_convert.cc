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

pb::TensorLayout LayoutOf(const pb::CompactTensors& run, int i) {
  pb::TensorLayout layout;
  layout.set_key(run.tensors(i).key());
  if (run.has_dtensor()) {
    *layout.mutable_placements() = run.dtensor().placements();
    layout.set_flat_sharded(run.dtensor().has_flat_over());
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

// For every piece position, the run and its tensor placed there ({-1, -1}: the next listed
// shard).
absl::StatusOr<std::vector<std::pair<int, int>>> CompactSlots(const pb::RankState& state,
                                                              absl::string_view who,
                                                              int64_t max_pieces) {
  int64_t total = state.shards_size();
  for (const pb::CompactTensors& run : state.compact_tensors()) total += run.tensors_size();
  if (total > max_pieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " describes ", total, " pieces; at most ", max_pieces));
  }
  std::vector<std::pair<int, int>> slots(total, {-1, -1});
  for (int r = 0; r < state.compact_tensors_size(); ++r) {
    const pb::CompactTensors& run = state.compact_tensors(r);
    if (run.index_size() != run.tensors_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": a compact run of ", run.tensors_size(), " tensors (the first: tensor ",
          run.tensors_size() > 0 ? run.tensors(0).key() : "none", ") gives ", run.index_size(),
          " indices"));
    }
    for (int i = 0; i < run.tensors_size(); ++i) {
      const int64_t at = run.index(i);
      if (at < 0 || at >= total || slots[at].first != -1) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": compact tensor ", run.tensors(i).key(), " would be piece ", at,
            at >= 0 && at < total ? ", already taken by another," : "", " of its ", total));
      }
      slots[at] = {r, i};
    }
  }
  return slots;
}

}  // namespace

namespace {

// Expands the tensors of one run, its DTensor layout checked and converted once (at the first
// tensor expanded, whose name its errors carry).
class RunExpansion {
 public:
  RunExpansion(const pb::CompactTensors& run,
               const google::protobuf::RepeatedPtrField<pb::CompactMesh>& meshes, int64_t rank)
      : run_(&run), meshes_(&meshes), rank_(rank) {}

  absl::StatusOr<pb::PieceMeta> Piece(int i) {
    const pb::TensorMeta& tensor = run_->tensors(i);
    const CompactSubject subject{tensor.key(), rank_};
    absl::StatusOr<ExpandedPiece> piece;
    if (run_->has_dtensor()) {
      if (!dtensor_.has_value()) dtensor_ = DTensorOf(subject);
      if (!dtensor_->ok()) return dtensor_->status();
      piece = (*dtensor_)->Expand(subject, Ints(tensor.global_shape()));
    } else if (run_->has_flat()) {
      piece = ExpandFlatPiece(subject, Ints(tensor.global_shape()), run_->flat().parts(),
                              run_->flat().part(), Ints(run_->replica_id()));
    } else {
      return Refuse(tensor.key(), rank_, "compact tensor without a DTensor or flat layout");
    }
    if (!piece.ok()) return piece.status();
    pb::PieceMeta out;
    *out.mutable_tensor() = tensor;
    *out.mutable_region() = RegionToProto(piece->region);
    out.mutable_replica_id()->Add(piece->replica_id.begin(), piece->replica_id.end());
    return out;
  }

 private:
  absl::StatusOr<DTensorExpander> DTensorOf(const CompactSubject& subject) const {
    const pb::CompactDTensor& d = run_->dtensor();
    if (d.mesh() < 0 || d.mesh() >= meshes_->size()) {
      return Refuse(subject.key, rank_,
                    absl::StrCat("mesh ", d.mesh(), " is not among the rank's ", meshes_->size(),
                                 " compact meshes"));
    }
    absl::StatusOr<std::vector<Placement>> placements = PlacementsFromProto(d, subject.key, rank_);
    if (!placements.ok()) return placements.status();
    const pb::CompactMesh& mesh = (*meshes_)[d.mesh()];
    return DTensorExpander::Create(
        subject, Ints(mesh.shape()), Ints(mesh.coordinate()), *placements, Ints(run_->replica_id()),
        d.has_flat_over() ? std::optional<int64_t>(d.flat_over()) : std::nullopt);
  }

  const pb::CompactTensors* run_;
  const google::protobuf::RepeatedPtrField<pb::CompactMesh>* meshes_;
  int64_t rank_;
  std::optional<absl::StatusOr<DTensorExpander>> dtensor_;
};

}  // namespace

absl::StatusOr<pb::PieceMeta> ExpandCompactTensor(
    const pb::CompactTensors& run, int i,
    const google::protobuf::RepeatedPtrField<pb::CompactMesh>& meshes, int64_t rank) {
  return RunExpansion(run, meshes, rank).Piece(i);
}

absl::StatusOr<const pb::RankState*> ExpandCompactTensors(const pb::RankState& state,
                                                          pb::RankState* expanded,
                                                          absl::string_view who,
                                                          int64_t max_pieces) {
  if (state.compact_tensors_size() == 0) return &state;
  absl::StatusOr<std::vector<std::pair<int, int>>> slots = CompactSlots(state, who, max_pieces);
  if (!slots.ok()) return slots.status();
  // A rank that describes memory kinds and layouts gives them for listed pieces and a memory
  // kind for each run; runs of MEMORY_KIND_UNSPECIFIED come from one that describes neither.
  const bool described = state.shards_size() > 0 ||
                         state.compact_tensors(0).memory_kind() != pb::MEMORY_KIND_UNSPECIFIED;
  const bool kinds = described && state.memory_kinds_size() == state.shards_size();
  const bool layouts = described && state.layouts_size() == state.shards_size();
  expanded->Clear();
  expanded->set_rank(state.rank());
  *expanded->mutable_mesh_shape() = state.mesh_shape();
  if (!kinds) *expanded->mutable_memory_kinds() = state.memory_kinds();
  if (!layouts) *expanded->mutable_layouts() = state.layouts();
  expanded->mutable_shards()->Reserve(static_cast<int>(slots->size()));
  std::vector<RunExpansion> runs;
  runs.reserve(state.compact_tensors_size());
  for (const pb::CompactTensors& run : state.compact_tensors()) {
    runs.emplace_back(run, state.compact_meshes(), state.rank());
  }
  int listed = 0;
  for (const auto& [r, i] : *slots) {
    if (r < 0) {
      if (kinds) expanded->add_memory_kinds(state.memory_kinds(listed));
      if (layouts) *expanded->add_layouts() = state.layouts(listed);
      *expanded->add_shards() = state.shards(listed++);
      continue;
    }
    const pb::CompactTensors& run = state.compact_tensors(r);
    absl::StatusOr<pb::PieceMeta> piece = runs[r].Piece(i);
    if (!piece.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", piece.status().message()));
    }
    *expanded->add_shards() = *std::move(piece);
    if (kinds) expanded->add_memory_kinds(run.memory_kind());
    if (layouts) *expanded->add_layouts() = LayoutOf(run, i);
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
  // The mesh's own replica id is the coordinates along the Replicate() dims (but flat_over);
  // what follows them in the piece's id is the description's own.
  int64_t mesh_ids = flat_over ? -1 : 0;
  for (const pb::Placement& p : layout.placements()) mesh_ids += p.has_replicate() ? 1 : 0;
  if (mesh_ids < 0 || mesh_ids > piece.replica_id_size()) {
    AddPiece(piece, kind, layout);
    return false;
  }
  const int meshes_before = state_->compact_meshes_size();
  pb::CompactTensors run;
  run.mutable_dtensor()->set_mesh(MeshIndex(mesh_shape, coordinate));
  *run.mutable_dtensor()->mutable_placements() = layout.placements();
  if (flat_over) run.mutable_dtensor()->set_flat_over(static_cast<int32_t>(*flat_over));
  run.mutable_replica_id()->Add(piece.replica_id().begin() + mesh_ids, piece.replica_id().end());
  run.set_memory_kind(with_kinds_and_layouts_ ? kind : pb::MEMORY_KIND_UNSPECIFIED);
  if (AddToRun(run, piece, kind, layout)) return true;
  while (state_->compact_meshes_size() > meshes_before) {
    state_->mutable_compact_meshes()->RemoveLast();
  }
  return false;
}

bool RankStateWriter::AddFlat(const pb::PieceMeta& piece, pb::MemoryKind kind,
                              const pb::TensorLayout& layout, int64_t parts, int64_t part) {
  pb::CompactTensors run;
  run.mutable_flat()->set_parts(parts);
  run.mutable_flat()->set_part(part);
  *run.mutable_replica_id() = piece.replica_id();
  run.set_memory_kind(with_kinds_and_layouts_ ? kind : pb::MEMORY_KIND_UNSPECIFIED);
  return AddToRun(run, piece, kind, layout);
}

bool RankStateWriter::AddToRun(const pb::CompactTensors& run, const pb::PieceMeta& piece,
                               pb::MemoryKind kind, const pb::TensorLayout& layout) {
  auto* runs = state_->mutable_compact_tensors();
  auto [found, added] = run_of_layout_.try_emplace(run.SerializeAsString(), runs->size());
  if (added) *runs->Add() = run;
  pb::CompactTensors& into = (*runs)[found->second];
  *into.add_tensors() = piece.tensor();
  into.add_index(pieces_);
  const int i = into.tensors_size() - 1;
  absl::StatusOr<pb::PieceMeta> expanded =
      ExpandCompactTensor(into, i, state_->compact_meshes(), state_->rank());
  // The expansion must also give back the layout the coordinator keeps for the manifest.
  const bool exact = expanded.ok() && SamePiece(*expanded, piece) &&
                     (!with_kinds_and_layouts_ ||
                      LayoutOf(into, i).SerializeAsString() == layout.SerializeAsString());
  if (!exact) {
    into.mutable_tensors()->RemoveLast();
    into.mutable_index()->RemoveLast();
    if (added) {
      runs->RemoveLast();
      run_of_layout_.erase(found);
    }
    AddPiece(piece, kind, layout);
    return false;
  }
  ++pieces_;
  return true;
}

}  // namespace ckpt
