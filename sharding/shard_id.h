// Shard identity as Megatron-core defines it: (key, global offset tuple, flat range or None),
// ordered exactly as Python orders such tuples.
#ifndef CKPT_SHARDING_SHARD_ID_H_
#define CKPT_SHARDING_SHARD_ID_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "sharding/region.h"

namespace ckpt {

// Identifies one shard of one tensor: its key, the global offset of its box, and its flat
// range (absent for box-only shards).
struct ShardId {
  std::string key;
  std::vector<int64_t> offsets;
  std::optional<FlatRange> flat;

  // E.g. ("decoder.w", (0, 128), (0, 4096)) or ("decoder.w", (0, 128), None).
  std::string DebugString() const;

  friend bool operator==(const ShardId& a, const ShardId& b) {
    return a.key == b.key && a.offsets == b.offsets && a.flat == b.flat;
  }
  friend bool operator!=(const ShardId& a, const ShardId& b) { return !(a == b); }

  template <typename H>
  friend H AbslHashValue(H h, const ShardId& id) {
    h = H::combine(std::move(h), id.key, id.offsets, id.flat.has_value());
    if (id.flat) h = H::combine(std::move(h), id.flat->start, id.flat->stop);
    return h;
  }
};

// Python's tuple comparison. Returns <0, 0, >0. Keys compare as UTF-8 bytes (unsigned, which
// is code-point order), offsets lexicographically with a shorter prefix first, then flat
// ranges as (start, stop). When keys and offsets are equal and exactly one side has a flat
// range, Python raises TypeError: `*incomparable` is set to true (if non-null) and the
// result orders None first (-1 or 1), the same order ShardIdLess uses.
int CompareShardIds(const ShardId& a, const ShardId& b, bool* incomparable = nullptr);

// Strict weak order for containers; treats "None" as less than any range. Callers that need
// Python's TypeError must detect mixed None/range ids themselves (see CompareShardIds).
struct ShardIdLess {
  bool operator()(const ShardId& a, const ShardId& b) const { return CompareShardIds(a, b) < 0; }
};

}  // namespace ckpt

#endif  // CKPT_SHARDING_SHARD_ID_H_
