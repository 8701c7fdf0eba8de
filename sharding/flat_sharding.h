// Flat sharding as OLMo-core's ShardingSpec (ZeRO / FSDP flat shards): each rank owns a tuple
// of (start, end) ranges into the row-major flattening of the unsharded tensor, and its local
// shard is those ranges concatenated.
//
// The usual even split (EvenFlatSharding) follows torch.chunk on the flattened tensor, as
// FSDP's FlatParamHandle and OLMo-core do: chunk = ceil(numel / world_size); rank r owns
// [min(numel, r * chunk), min(numel, (r + 1) * chunk)), so trailing ranks may own fewer
// elements or none. When padding is requested (ChunkUnsharded(pad = true)), every rank's
// chunk is right-padded with zero bytes to max(sharded_numels), i.e. to `chunk` elements. The
// padding is never part of the tensor: it is not described by any range.
//
// FlatBufferSharding splits the concatenation of several tensors (a flat parameter or a
// distributed-optimizer bucket) evenly over ranks, padding the buffer's end to a multiple of
// world_size (Megatron's distributed optimizer / FSDP flat param rule).
#ifndef CKPT_SHARDING_FLAT_SHARDING_H_
#define CKPT_SHARDING_FLAT_SHARDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/overlap.h"
#include "sharding/region.h"

namespace ckpt {

// OLMo-core's ShardingSpec: per rank, the ranges of the flattened unsharded tensor it owns,
// in local storage order.
struct FlatShardingSpec {
  std::vector<int64_t> unsharded_shape;
  std::vector<std::vector<FlatRange>> unsharded_flattened_offsets;  // [rank][i]

  int world_size() const { return static_cast<int>(unsharded_flattened_offsets.size()); }
  // Elements of each rank's local shard (sum of its range sizes).
  std::vector<int64_t> sharded_numels() const;
};

// Checks shape, that each range is inside [0, numel] with start <= end, and (when
// `require_complete`) that the ranges of all ranks cover every element exactly once. Errors
// name the rank and range.
absl::Status ValidateFlatSharding(const FlatShardingSpec& spec, bool require_complete);

// The even torch.chunk split described above; world_size >= 1.
absl::StatusOr<FlatShardingSpec> EvenFlatSharding(absl::Span<const int64_t> shape, int world_size);

// Rank `rank`'s range of that split of `numel` elements, in O(1) (EvenFlatSharding lists all
// world_size ranges: building it per rank is quadratic in ranks). Needs 0 <= numel <=
// kMaxElements, world_size >= 1 and 0 <= rank < world_size.
absl::StatusOr<FlatRange> EvenFlatRange(int64_t numel, int64_t world_size, int64_t rank);

// Runs that copy rank `rank`'s local shard out of the unsharded tensor (src = unsharded
// storage, dst = the local shard).
absl::StatusOr<std::vector<CopyRun>> ShardedChunkRuns(const FlatShardingSpec& spec, int rank);

// sharded_chunk: rank's local shard, copied from an unsharded host buffer of elem_size-byte
// elements.
absl::StatusOr<std::vector<char>> ShardedChunk(const FlatShardingSpec& spec, int rank,
                                               int64_t elem_size, absl::Span<const char> unsharded);

// chunk_unsharded: every rank's local shard; with `pad`, each right-padded with zero bytes to
// max(sharded_numels) elements.
absl::StatusOr<std::vector<std::vector<char>>> ChunkUnsharded(const FlatShardingSpec& spec,
                                                              int64_t elem_size,
                                                              absl::Span<const char> unsharded,
                                                              bool pad);

// The inverse: rebuilds the unsharded tensor from every rank's (possibly padded) shard.
// Requires a complete spec.
absl::StatusOr<std::vector<char>> Unshard(const FlatShardingSpec& spec, int64_t elem_size,
                                          absl::Span<const std::vector<char>> shards);

// The regions a rank owns: the whole box of the tensor narrowed to each range (empty ranges
// dropped), in local storage order; local shard offsets of these regions follow one another.
std::vector<Region> FlatShardRegions(const FlatShardingSpec& spec, int rank);

// The region of the flat range [start, stop) of the whole tensor.
Region FlatRangeRegion(absl::Span<const int64_t> shape, FlatRange range);

// A flat range of a region's box, as disjoint boxes (no flat ranges) in flat order, each with
// the local index of its first element in the flat-range piece. At most 2 * ndim - 1 boxes
// (one for 0-d); none for an empty range.
struct FlatSubBox {
  Region box;
  int64_t local_start = 0;
};
std::vector<FlatSubBox> FlatRangeToBoxes(const Region& box, FlatRange range);

// One tensor's part of one rank's share of a flat buffer.
struct BufferSlice {
  int tensor = 0;             // index into the tensor list
  FlatRange range;            // range of that tensor's flattening
  int64_t buffer_offset = 0;  // offset within the rank's local shard
};

// Concatenates tensors of the given element counts (in order), pads the total to a multiple
// of world_size and gives rank r the r-th equal part. Returns, per rank, the non-empty
// slices it owns in buffer order.
absl::StatusOr<std::vector<std::vector<BufferSlice>>> FlatBufferSharding(
    absl::Span<const int64_t> tensor_numels, int world_size);

}  // namespace ckpt

#endif  // CKPT_SHARDING_FLAT_SHARDING_H_
