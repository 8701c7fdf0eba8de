// Megatron-core's greedy shard -> rank distribution (exchange_utils.distribute_shards_to_ranks),
// reproduced bit for bit, with a fast path for very large jobs.
//
// Rules (see DESIGN.md):
//   * shards are visited in ascending order of
//       (in cross set ? 1 : 0, len(holders) counting duplicates and out-of-range entries,
//        -bytes, shard id)
//     with shard ids compared as Python compares (key, offsets, flat range | None) tuples;
//   * each shard goes to the holder with the smallest (bytes assigned so far, rank); holders
//     outside [0, num_ranks) are never chosen;
//   * every visited shard adds its bytes to its rank (zero-size and cross shards too);
//   * the result lists the shards in visiting order.
// Errors (InvalidArgument, naming the shard): num_ranks outside [0, kMaxWorldSize], a shard
// without a size, a negative size, sizes adding up past int64, a shard without any holder in
// [0, num_ranks), a repeated shard id, and two shards that tie on every earlier sort field
// but differ in "flat range vs None" (Python raises TypeError there).
#ifndef CKPT_PLANNER_DISTRIBUTE_H_
#define CKPT_PLANNER_DISTRIBUTE_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sharding/piece_id.h"

namespace ckpt {

// One shard to distribute. `holder_list` indexes DistributionInput::holder_lists, so that
// many shards held by the same ranks (e.g. a whole data-parallel group) share one list.
struct DistributablePiece {
  PieceId id;
  std::optional<int64_t> size_bytes;  // nullopt: "no size" (an error, as Python's KeyError)
  int32_t holder_list = 0;
  bool cross_group = false;  // in Megatron's cross_parallelization_group_loads
};

// The whole problem: `num_ranks` ranks and the shards with their holder lists. Holder lists
// are kept exactly as given (order, duplicates and out-of-range ranks included).
struct DistributionInput {
  int64_t num_ranks = 0;
  std::vector<std::vector<int64_t>> holder_lists;
  std::vector<DistributablePiece> shards;

  // Appends a shard with its own holder list; returns its index.
  int32_t AddShard(PieceId id, std::optional<int64_t> size_bytes, std::vector<int64_t> holders,
                   bool cross_group = false);
};

// The same problem in flat arrays, for very large inputs (e.g. `ckptctl plan distribute`'s
// 200,000 shards): keys interned, each shard's offsets and holder list as ranges of shared
// arrays, so nothing is allocated per shard. DistributeShardsToRanks runs on this form.
struct CompactDistributionInput {
  static constexpr int64_t kNoSize = std::numeric_limits<int64_t>::min();

  struct Shard {
    int64_t size_bytes = kNoSize;  // kNoSize: "no size" (an error)
    int64_t offsets_start = 0;     // its offsets are offsets[offsets_start, + num_offsets)
    int32_t num_offsets = 0;
    int32_t key = 0;          // index into keys
    int32_t holder_list = 0;  // its holders are holders[list_start[l], list_start[l + 1])
    int32_t flat = -1;        // index into flats; -1: None
    bool cross_group = false;
  };

  int64_t num_ranks = 0;
  // Keys by index; views of bytes the caller keeps alive. Equal strings may repeat.
  std::vector<std::string_view> keys;
  std::vector<int64_t> offsets;
  std::vector<FlatRange> flats;
  // Holder lists, kept as given (order and duplicates); a holder outside [0, num_ranks)
  // (stored as -1 by ToCompactDistributionInput) counts in len(holders), is never chosen.
  std::vector<int32_t> holders;
  std::vector<int64_t> list_start = {0};  // one more than the number of lists
  std::vector<Shard> shards;
  // Bytes each rank is given before these shards are visited (empty: none; else one entry per
  // rank, none negative; they count toward the 2^63 - 1 total). A caller that gives shards of
  // one holder to that holder itself passes their bytes here: such shards come first in the
  // visiting order (outside the cross set), so only their bytes bear on the rest, and the
  // result is the assignment of the rest, as if they had been visited too.
  std::vector<int64_t> initial_bytes;

  // Shard `shard`'s id as a PieceId (for error messages and tests).
  PieceId IdOf(int32_t shard) const;
};

// `input` in flat arrays (keys viewing input's strings; out-of-range holders as -1). `input`
// must have passed internal::ValidateDistributionInput.
CompactDistributionInput ToCompactDistributionInput(const DistributionInput& input);

// One decision: shards[shard] is handled by `rank`.
struct ShardAssignment {
  int32_t shard = 0;
  int64_t rank = 0;

  friend bool operator==(const ShardAssignment& a, const ShardAssignment& b) {
    return a.shard == b.shard && a.rank == b.rank;
  }
};

// The distribution, in visiting order. Fast: O(S log S) sorting plus, per shard, either a
// scan of a small holder set or O(log H) amortized work on a lazily-invalidated heap shared
// by every shard with the same holder set.
absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanks(
    const DistributionInput& input);

// The same on the compact form: same results and the same errors as on the equivalent
// DistributionInput.
absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanks(
    const CompactDistributionInput& input);

// The straightforward twin (full tuple sort, then a scan of every holder per shard) used by
// property tests to check the fast path; same results and errors.
absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanksReference(
    const DistributionInput& input);

namespace internal {

// Checks num_ranks, sizes and holders; shared by both implementations.
absl::Status ValidateDistributionInput(const DistributionInput& input);
// The same checks, with the same messages, on the compact form.
absl::Status ValidateDistributionInput(const CompactDistributionInput& input);

// Hash-based repeated-id check (the reference's; the fast path finds repeats while sorting).
absl::Status CheckDistinctIds(const DistributionInput& input);
absl::Status RepeatedShardError(const PieceId& id);

// The error for two shards Python could not order (None vs range under equal key/offsets).
absl::Status IncomparableShardsError(const PieceId& a, const PieceId& b);

}  // namespace internal
}  // namespace ckpt

#endif  // CKPT_PLANNER_DISTRIBUTE_H_
