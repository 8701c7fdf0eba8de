#include "sharding/dtensor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ckpt {

absl::StatusOr<DeviceMesh> DeviceMesh::Create(std::vector<int64_t> shape) {
  int64_t size = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("device mesh ", ShapeString(shape),
                                                     " has dim ", i, " of size ", shape[i],
                                                     "; every mesh dim must be >= 1"));
    }
    // size <= kMaxWorldSize here, so the quotient is >= 1 and nothing overflows.
    if (shape[i] > kMaxWorldSize / size) {
      return absl::InvalidArgumentError(absl::StrCat("device mesh ", ShapeString(shape),
                                                     " has more than the limit of ", kMaxWorldSize,
                                                     " ranks"));
    }
    size *= shape[i];
  }
  return DeviceMesh(std::move(shape), size);
}

absl::StatusOr<std::vector<int64_t>> DeviceMesh::Coordinate(int64_t rank) const {
  if (rank < 0 || rank >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside ", DebugString(), " of ", size_, " ranks"));
  }
  std::vector<int64_t> coord(shape_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    coord[i] = rank % shape_[i];
    rank /= shape_[i];
  }
  return coord;
}

absl::StatusOr<int64_t> DeviceMesh::Rank(absl::Span<const int64_t> coordinate) const {
  if (coordinate.size() != shape_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("coordinate ", ShapeString(coordinate), " has ",
                                                   coordinate.size(), " entries but ",
                                                   DebugString(), " has ", shape_.size(), " dims"));
  }
  int64_t rank = 0;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (coordinate[i] < 0 || coordinate[i] >= shape_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("coordinate ", ShapeString(coordinate),
                                                     " is outside ", DebugString(), " at mesh dim ",
                                                     i));
    }
    rank = rank * shape_[i] + coordinate[i];
  }
  return rank;
}

std::string DeviceMesh::DebugString() const {
  return absl::StrCat("DeviceMesh(", absl::StrJoin(shape_, ", "), ")");
}

std::string Placement::DebugString() const {
  return is_shard() ? absl::StrCat("Shard(", dim, ")") : "Replicate()";
}

std::string PlacementsString(absl::Span<const Placement> placements) {
  std::vector<std::string> parts;
  for (const Placement& p : placements) parts.push_back(p.DebugString());
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

ChunkExtent TorchChunk(int64_t length, int64_t num_chunks, int64_t index) {
  // ceil(length / num_chunks) without overflow for lengths near 2^62.
  const int64_t chunk = length / num_chunks + (length % num_chunks != 0 ? 1 : 0);
  // index * chunk may exceed int64 only when it is far beyond length; clamp first.
  if (chunk == 0 || index >= (length + chunk - 1) / chunk) return ChunkExtent{length, 0};
  const int64_t start = index * chunk;
  return ChunkExtent{start, std::min(length - start, chunk)};
}

bool LocalShard::is_main_replica() const {
  return std::all_of(replica_id.begin(), replica_id.end(), [](int64_t c) { return c == 0; });
}

absl::Status ValidatePlacements(absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
                                absl::Span<const Placement> placements) {
  CKPT_RETURN_IF_ERROR(CheckedNumElements(global_shape).status());
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("placements ", PlacementsString(placements), " have ", placements.size(),
                     " entries but ", mesh.DebugString(), " has ", mesh.ndim(), " dims"));
  }
  const int n = static_cast<int>(global_shape.size());
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (p.is_shard() && (p.dim < -n || p.dim >= n)) {
      return absl::InvalidArgumentError(absl::StrCat("placement ", p.DebugString(), " at mesh dim ",
                                                     i, " is out of range for shape ",
                                                     ShapeString(global_shape)));
    }
  }
  return absl::OkStatus();
}

namespace {

// The shard of the rank at `coord`, placements already validated, into *shard's buffers.
void FillLocalShard(absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
                    absl::Span<const Placement> placements, absl::Span<const int64_t> coord,
                    LocalShard* shard) {
  const int n = static_cast<int>(global_shape.size());
  shard->shape.assign(global_shape.begin(), global_shape.end());
  shard->offset.assign(n, 0);
  shard->replica_id.clear();
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[i];
    if (!p.is_shard()) {
      shard->replica_id.push_back(coord[i]);
      continue;
    }
    const int d = p.dim < 0 ? p.dim + n : p.dim;
    const ChunkExtent chunk = TorchChunk(shard->shape[d], mesh.shape()[i], coord[i]);
    shard->shape[d] = chunk.size;
    // As PyTorch: nested offsets add up; a zero-sized shard gets the dim's global size.
    shard->offset[d] = chunk.size == 0 ? global_shape[d] : shard->offset[d] + chunk.offset;
  }
}

}  // namespace

absl::StatusOr<LocalShard> ComputeLocalShard(absl::Span<const int64_t> global_shape,
                                             const DeviceMesh& mesh,
                                             absl::Span<const Placement> placements, int64_t rank) {
  CKPT_RETURN_IF_ERROR(ValidatePlacements(global_shape, mesh, placements));
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> coord, mesh.Coordinate(rank));
  LocalShard shard;
  FillLocalShard(global_shape, mesh, placements, coord, &shard);
  return shard;
}

absl::Status ForEachLocalShard(
    absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
    absl::Span<const Placement> placements,
    absl::FunctionRef<absl::Status(int64_t rank, absl::Span<const int64_t> coordinate,
                                   const LocalShard& shard)>
        visit) {
  CKPT_RETURN_IF_ERROR(ValidatePlacements(global_shape, mesh, placements));
  std::vector<int64_t> coord(mesh.ndim(), 0);
  LocalShard shard;
  for (int64_t rank = 0; rank < mesh.size(); ++rank) {
    FillLocalShard(global_shape, mesh, placements, coord, &shard);
    CKPT_RETURN_IF_ERROR(visit(rank, coord, shard));
    // Next coordinate, row-major (the last mesh dim fastest).
    for (int i = mesh.ndim() - 1; i >= 0 && ++coord[i] == mesh.shape()[i]; --i) coord[i] = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LocalShard>> ComputeAllLocalShards(
    absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
    absl::Span<const Placement> placements) {
  std::vector<LocalShard> shards;
  shards.reserve(mesh.size());
  CKPT_RETURN_IF_ERROR(
      ForEachLocalShard(global_shape, mesh, placements,
                        [&](int64_t, absl::Span<const int64_t>, const LocalShard& shard) {
                          shards.push_back(shard);
                          return absl::OkStatus();
                        }));
  return shards;
}

}  // namespace ckpt
