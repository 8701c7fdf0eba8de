// DTensor-style placements: a device mesh of ranks and, per mesh dimension, Shard(dim) or
// Replicate(); the local shape, global offset and replica id of every rank exactly as
// PyTorch's DTensor computes them (torch.distributed.tensor._utils.
// compute_local_shape_and_global_offset).
#ifndef CKPT_SHARDING_DTENSOR_H_
#define CKPT_SHARDING_DTENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/region.h"

namespace ckpt {

// The most ranks a device mesh, and so a job or a target layout, may have: 2^20 = 1,048,576,
// ten times the 100,000 ranks ckpt is built for. Per-rank state is allocated only after this
// is checked, so a hostile world size is an error instead of std::bad_alloc.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// An N-d grid of ranks numbered row-major: rank = sum(coord[i] * prod(shape[i+1:])), like
// torch.arange(world).view(mesh_shape).
class DeviceMesh {
 public:
  // Every dim must be >= 1 and the product (the number of ranks) at most kMaxWorldSize.
  static absl::StatusOr<DeviceMesh> Create(std::vector<int64_t> shape);

  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return size_; }  // number of ranks

  // Coordinate of `rank` (0 <= rank < size()), else InvalidArgument.
  absl::StatusOr<std::vector<int64_t>> Coordinate(int64_t rank) const;
  // Rank at `coordinate` (one entry per mesh dim, each in range), else InvalidArgument.
  absl::StatusOr<int64_t> Rank(absl::Span<const int64_t> coordinate) const;

  std::string DebugString() const;  // "DeviceMesh(2, 4)"

 private:
  explicit DeviceMesh(std::vector<int64_t> shape, int64_t size)
      : shape_(std::move(shape)), size_(size) {}
  std::vector<int64_t> shape_;
  int64_t size_ = 1;
};

// How a tensor is laid out along one mesh dimension: split along tensor dim `dim`
// (Shard(dim)) or the whole tensor on every coordinate (Replicate()).
struct Placement {
  enum class Kind { kShard, kReplicate };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // tensor dim for kShard; negative values count from the end as in PyTorch

  static Placement Shard(int dim) { return Placement{Kind::kShard, dim}; }
  static Placement Replicate() { return Placement{Kind::kReplicate, 0}; }
  bool is_shard() const { return kind == Kind::kShard; }
  std::string DebugString() const;  // "Shard(0)" / "Replicate()"

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind == Kind::kReplicate || a.dim == b.dim);
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
};

// "[Shard(0), Replicate()]".
std::string PlacementsString(absl::Span<const Placement> placements);

// torch.chunk split of a length: `num_chunks` chunks of ceil(length / num_chunks); chunk
// `index` is [index * chunk, min(length, (index + 1) * chunk)), possibly empty.
struct ChunkExtent {
  int64_t offset = 0;  // offset within the split length; for an empty chunk: `length`
  int64_t size = 0;
};
ChunkExtent TorchChunk(int64_t length, int64_t num_chunks, int64_t index);

// One rank's local piece of a DTensor.
struct LocalShard {
  std::vector<int64_t> shape;       // local shape
  std::vector<int64_t> offset;      // global offset; a dim whose local size is 0 has offset =
                                    // that dim's global size (PyTorch's standard value)
  std::vector<int64_t> replica_id;  // coordinates along the Replicate() mesh dims, in order
  Region region() const { return Region{offset, shape, std::nullopt}; }
  bool is_main_replica() const;  // replica id all zeros
};

// Checks placements against the mesh and tensor: one per mesh dim, Shard dims in range,
// shape valid. Errors name the placement and shape.
absl::Status ValidatePlacements(absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
                                absl::Span<const Placement> placements);

// The local shape, global offset and replica id of `rank`. Mesh dims are applied in order;
// several mesh dims sharding the same tensor dim nest (the later one splits the chunk the
// earlier one produced). A zero-sized local dim gets offset = global size of that dim.
absl::StatusOr<LocalShard> ComputeLocalShard(absl::Span<const int64_t> global_shape,
                                             const DeviceMesh& mesh,
                                             absl::Span<const Placement> placements, int64_t rank);

// Calls `visit(rank, coordinate, shard)` for every rank in rank order with the shard
// ComputeLocalShard gives it; validates once and reuses one shard's buffers, so the cost
// per rank is O(tensor dims + mesh dims) with no allocation. Stops at the first error
// `visit` returns.
absl::Status ForEachLocalShard(
    absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
    absl::Span<const Placement> placements,
    absl::FunctionRef<absl::Status(int64_t rank, absl::Span<const int64_t> coordinate,
                                   const LocalShard& shard)>
        visit);

// The local shards of every rank, indexed by rank.
absl::StatusOr<std::vector<LocalShard>> ComputeAllLocalShards(
    absl::Span<const int64_t> global_shape, const DeviceMesh& mesh,
    absl::Span<const Placement> placements);

}  // namespace ckpt

#endif  // CKPT_SHARDING_DTENSOR_H_
