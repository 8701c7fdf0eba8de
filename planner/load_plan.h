// The load plan: from a checkpoint's stored pieces and every rank's requested regions
// (possibly a different layout than the one saved), who reads which byte ranges from storage
// and which element runs go to which rank, scheduled in waves that bound every rank's memory.
//
// Reading: each stored piece somebody needs is read once, by one of the ranks that need part
// of it, chosen with Megatron's greedy distribution (holders = the distinct ranks needing it,
// ascending; size = bytes actually read). Only the contiguous span of the piece's storage that
// covers every needed element is read (storage is the row-major flattening of the piece's box,
// narrowed to its flat range; see sharding/overlap.h). When the ranks needing a piece want
// disjoint spans of it, each reads its own span instead (split_disjoint_reads): the same bytes
// from storage, nothing to exchange; only pieces whose bytes several ranks need are exchanged.
//
// Exchange: a read unit's bytes reach other ranks according to the algorithm:
//   kOverlapAllToAll  each needing rank receives only the elements it needs, once even when
//                     several of its requests need them (ours; the default here);
//   kBroadcast        one broadcast per unit from its reader to every other group rank
//                     (Megatron's default), only for units needed by a rank besides the reader;
//   kGatherRounds, kGatherObject  all-gathers: every rank receives every exchanged unit, with
//                     the same memory cost per wave as kBroadcast.
// Memory: a rank's bytes in flight in a wave are the unit buffers it reads plus the bytes it
// receives (all of a unit for broadcast-like algorithms); copies into the destination tensors
// themselves are not counted (they are allocated by the trainer). Units are packed into waves
// in distribution order while every rank stays within the budget; a span larger than the
// budget is split into several units.
#ifndef CKPT_PLANNER_LOAD_PLAN_H_
#define CKPT_PLANNER_LOAD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/overlap.h"
#include "sharding/region.h"
#include "sharding/tensor_meta.h"

namespace ckpt {

// A stored piece of the checkpoint (manifest StoredPiece, minus checksum and names).
struct StoredPieceInfo {
  std::string key;
  Region region;
  std::string file;
  int64_t byte_offset = 0;  // absolute offset of the piece's first byte in `file`
  int64_t byte_length = 0;  // region.NumElements() * dtype size
};

// A region some rank wants filled (its destination storage follows the same convention).
struct LoadRequest {
  int64_t rank = 0;
  std::string key;
  Region region;
  // Whether the requesting rank holds this region as its main replica (replica id all zeros).
  // A stored piece every one of whose needing requests is not a main replica is a cross-group
  // load (Megatron's ignore_groups: needed by this group, main replica in another one) and is
  // visited after the others when choosing readers.
  bool main_replica = true;
};

enum class ExchangeAlgorithm { kOverlapAllToAll, kBroadcast, kGatherRounds, kGatherObject };

struct LoadPlanOptions {
  ExchangeAlgorithm algorithm = ExchangeAlgorithm::kOverlapAllToAll;
  // Bytes in flight allowed on any rank in one wave; must hold at least one element.
  int64_t memory_budget_bytes = int64_t{1} << 30;
  // A piece whose needing ranks want disjoint spans of its storage (e.g. a TP=2 shard loaded
  // as two TP=4 shards) is read by each of them, its own span: as few bytes from storage as
  // one reader and none over the network. Off: one reader per piece, the rest exchanged.
  bool split_disjoint_reads = true;
  // When not empty (one list per stored piece): the only ranks that may read each piece, e.g.
  // the ranks whose workers hold the piece's file in memory (coordinator/memory_kinds.h). A
  // reader need not need the piece itself; every rank needing it then receives it. Such
  // pieces are never split into own reads. A needed piece with an empty list is
  // FailedPrecondition naming it.
  std::vector<std::vector<int64_t>> readers_of_piece;
};

// One storage read into a unit buffer: elements [first_element, first_element + num_elements)
// of stored piece `piece`, i.e. bytes [file_offset, file_offset + byte_length) of `file`.
struct ReadUnit {
  int64_t piece = 0;  // index into the stored pieces
  int64_t reader = 0;
  std::string file;
  int64_t file_offset = 0;
  int64_t byte_length = 0;
  int64_t first_element = 0;
  int64_t num_elements = 0;
  int64_t elem_size = 0;
  DType dtype = DType::kF32;
  bool exchanged = false;  // some rank other than the reader needs part of it
};

// Runs copied from a unit buffer (src_offset relative to the unit's first element) into the
// storage of request `request` on rank dst_rank (dst_offset local to the request region).
struct Delivery {
  int64_t unit = 0;  // index into the wave's units
  int64_t request = 0;
  int64_t src_rank = 0;
  int64_t dst_rank = 0;
  int64_t elements = 0;
  std::vector<CopyRun> runs;
};

// One all-gather of kGatherRounds (Megatron's exchange_loaded_tensors_gather_rounds): for one
// dtype, the k-th exchanged unit read by each rank; ranks without a k-th unit send nothing.
struct GatherRound {
  DType dtype = DType::kF32;
  std::vector<std::pair<int64_t, int64_t>> unit_of_rank;  // (rank, unit index), rank order
};

// Units read and delivered together; waves run one after another.
struct LoadWave {
  std::vector<ReadUnit> units;  // in distribution order (broadcasts go in this order)
  std::vector<Delivery> deliveries;
  int64_t peak_bytes_in_flight = 0;  // the largest rank's bytes in flight in this wave
  // kGatherRounds only: dtypes in name order, then rounds k = 0, 1, ...
  std::vector<GatherRound> rounds;
};

struct LoadPlan {
  int64_t num_ranks = 0;
  ExchangeAlgorithm algorithm = ExchangeAlgorithm::kOverlapAllToAll;
  std::vector<LoadWave> waves;
  // Stored piece -> reader, in distribution (visiting) order.
  std::vector<std::pair<int64_t, int64_t>> reader_of_piece;
};

// Builds the plan. Errors (InvalidArgument) name the tensor, rank, region and file: unknown
// keys, invalid regions, pieces whose byte length disagrees with their region, requested
// elements no stored piece holds, stored pieces that overlap on a requested element, ranks
// outside [0, num_ranks), and a budget smaller than one element.
absl::StatusOr<LoadPlan> BuildLoadPlan(absl::Span<const TensorMeta> tensors,
                                       absl::Span<const StoredPieceInfo> pieces,
                                       absl::Span<const LoadRequest> requests, int64_t num_ranks,
                                       const LoadPlanOptions& options = {});

// Elements of a unit covered by the runs of `deliveries` (each element counted once).
int64_t DistinctSourceElements(absl::Span<const Delivery* const> deliveries);

// Bytes in flight on `rank` during `wave` under `algorithm` (see the header comment).
int64_t WaveBytesInFlight(const LoadWave& wave, ExchangeAlgorithm algorithm, int64_t rank);

}  // namespace ckpt

#endif  // CKPT_PLANNER_LOAD_PLAN_H_
