#include "python/src/compact_view.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "proto/compact_convert.h"
#include "python/src/errors.h"

namespace nb = nanobind;

namespace ckpt::python {
namespace {

using Ints = std::vector<int64_t>;
// (offsets, lengths, flat range or None, replica id) of an expanded piece.
using PieceTuple = std::tuple<Ints, Ints, std::optional<std::tuple<int64_t, int64_t>>, Ints>;

PieceTuple Expand(const pb::RankState& state) {
  pb::PieceMeta piece = ValueOrThrow(
      ExpandCompactTensor(state.compact_tensors(0), 0, state.compact_meshes(), state.rank()));
  std::optional<std::tuple<int64_t, int64_t>> flat;
  if (piece.region().has_flat()) {
    flat = std::make_tuple(piece.region().flat().start(), piece.region().flat().stop());
  }
  return {Ints(piece.region().offsets().begin(), piece.region().offsets().end()),
          Ints(piece.region().lengths().begin(), piece.region().lengths().end()), flat,
          Ints(piece.replica_id().begin(), piece.replica_id().end())};
}

pb::CompactTensors* OneTensor(pb::RankState* state, const std::string& key, int64_t rank,
                              const Ints& global_shape, const Ints& replica_id) {
  state->set_rank(static_cast<int32_t>(rank));
  pb::CompactTensors* t = state->add_compact_tensors();
  pb::TensorMeta* tensor = t->add_tensors();
  tensor->set_key(key);
  tensor->mutable_global_shape()->Add(global_shape.begin(), global_shape.end());
  t->mutable_replica_id()->Add(replica_id.begin(), replica_id.end());
  return t;
}

// `placements`: one per mesh dim, the tensor dim for Shard(dim), None for Replicate().
PieceTuple ExpandDTensor(const std::string& key, const Ints& global_shape, const Ints& mesh_shape,
                         const Ints& coordinate, const std::vector<std::optional<int>>& placements,
                         const Ints& replica_suffix, int64_t rank) {
  pb::RankState state;
  pb::CompactTensors* t = OneTensor(&state, key, rank, global_shape, replica_suffix);
  t->mutable_dtensor()->set_mesh(0);
  for (const std::optional<int>& p : placements) {
    pb::Placement* out = t->mutable_dtensor()->add_placements();
    if (p) {
      out->set_shard_dim(*p);
    } else {
      out->set_replicate(true);
    }
  }
  pb::CompactMesh* mesh = state.add_compact_meshes();
  mesh->mutable_shape()->Add(mesh_shape.begin(), mesh_shape.end());
  mesh->mutable_coordinate()->Add(coordinate.begin(), coordinate.end());
  return Expand(state);
}

PieceTuple ExpandFlat(const std::string& key, const Ints& global_shape, int64_t parts, int64_t part,
                      const Ints& replica_id, int64_t rank) {
  pb::RankState state;
  pb::CompactTensors* t = OneTensor(&state, key, rank, global_shape, replica_id);
  t->mutable_flat()->set_parts(parts);
  t->mutable_flat()->set_part(part);
  return Expand(state);
}

}  // namespace

void RegisterCompactView(nb::module_& m) {
  m.def("expand_compact_dtensor", &ExpandDTensor, nb::arg("key"), nb::arg("global_shape"),
        nb::arg("mesh_shape"), nb::arg("coordinate"), nb::arg("placements"),
        nb::arg("replica_suffix"), nb::arg("rank"));
  m.def("expand_compact_flat", &ExpandFlat, nb::arg("key"), nb::arg("global_shape"),
        nb::arg("parts"), nb::arg("part"), nb::arg("replica_id"), nb::arg("rank"));
}

nb::dict DescriptionBytes(const client::StateDict& state) {
  pb::RankState compact, full;
  compact.set_rank(state.rank());
  full.set_rank(state.rank());
  RankStateWriter compact_writer(&compact, true), full_writer(&full, true);
  for (const pb::SharedTensor& t : state.Describe()) {
    const Ints mesh_shape(t.mesh_shape().begin(), t.mesh_shape().end());
    const Ints coordinate(t.mesh_coordinate().begin(), t.mesh_coordinate().end());
    compact_writer.Add(t.shard(), t.memory_kind(), t.layout(), mesh_shape, coordinate);
    full_writer.AddPiece(t.shard(), t.memory_kind(), t.layout());
  }
  nb::dict d;
  d["compact_bytes"] = compact.ByteSizeLong();
  d["full_bytes"] = full.ByteSizeLong();
  d["compact_tensors"] = compact.compact_tensors_size();
  d["pieces"] = full.shards_size();
  return d;
}

}  // namespace ckpt::python
