// A piece's identity as Megatron-core defines a shard's: (key, global offset tuple, flat range or
// None), ordered exactly as Python orders such tuples.
#ifndef CKPT_SHARDING_PIECE_ID_H_
#define CKPT_SHARDING_PIECE_ID_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "sharding/region.h"

namespace ckpt {

// Identifies one piece of one tensor: its key, the global offset of its box, and its flat
// range (absent for box-only pieces).
struct PieceId {
  std::string key;
  std::vector<int64_t> offsets;
  std::optional<FlatRange> flat;

  // E.g. ("decoder.w", (0, 128), (0, 4096)) or ("decoder.w", (0, 128), None).
  std::string DebugString() const;

  friend bool operator==(const PieceId& a, const PieceId& b) {
    return a.key == b.key && a.offsets == b.offsets && a.flat == b.flat;
  }
  friend bool operator!=(const PieceId& a, const PieceId& b) { return !(a == b); }

  template <typename H>
  friend H AbslHashValue(H h, const PieceId& id) {
    h = H::combine(std::move(h), id.key, id.offsets, id.flat.has_value());
    if (id.flat) h = H::combine(std::move(h), id.flat->start, id.flat->stop);
    return h;
  }
};

// Python's tuple comparison. Returns <0, 0, >0. Keys compare as UTF-8 bytes (unsigned, which
// is code-point order), offsets lexicographically with a shorter prefix first, then flat
// ranges as (start, stop). When keys and offsets are equal and exactly one side has a flat
// range, Python raises TypeError: `*incomparable` is set to true (if non-null) and the
// result orders None first (-1 or 1), the same order PieceIdLess uses.
int ComparePieceIds(const PieceId& a, const PieceId& b, bool* incomparable = nullptr);

// Strict weak order for containers; treats "None" as less than any range. Callers that need
// Python's TypeError must detect mixed None/range ids themselves (see ComparePieceIds).
// Hash and equality of PieceId through pointers, for maps that index ids owned elsewhere
// without copying them (key string and offsets) per piece.
struct PieceIdPtrHash {
  size_t operator()(const PieceId* id) const { return absl::Hash<PieceId>()(*id); }
};
struct PieceIdPtrEq {
  bool operator()(const PieceId* a, const PieceId* b) const { return *a == *b; }
};

struct PieceIdLess {
  bool operator()(const PieceId& a, const PieceId& b) const { return ComparePieceIds(a, b) < 0; }
};

}  // namespace ckpt

#endif  // CKPT_SHARDING_PIECE_ID_H_
