#include "planner/distribute.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "sharding/dtensor.h"

namespace ckpt {

int32_t DistributionInput::AddShard(PieceId id, std::optional<int64_t> size_bytes,
                                    std::vector<int64_t> holders, bool cross_group) {
  holder_lists.push_back(std::move(holders));
  shards.push_back(DistributablePiece{std::move(id), size_bytes,
                                      static_cast<int32_t>(holder_lists.size() - 1), cross_group});
  return static_cast<int32_t>(shards.size() - 1);
}

namespace internal {
namespace {

struct PieceIdPtrHash {
  size_t operator()(const PieceId* id) const { return absl::Hash<PieceId>()(*id); }
};
struct PieceIdPtrEq {
  bool operator()(const PieceId* a, const PieceId* b) const { return *a == *b; }
};

}  // namespace

absl::Status IncomparableShardsError(const PieceId& a, const PieceId& b) {
  return absl::InvalidArgumentError(absl::StrCat(
      "shards ", a.DebugString(), " and ", b.DebugString(),
      " cannot be ordered: they tie on every earlier sort field and compare a flat range "
      "with None (Python raises TypeError here)"));
}

absl::Status RepeatedShardError(const PieceId& id) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard ", id.DebugString(), " is listed more than once"));
}

absl::Status ValidateDistributionInput(const DistributionInput& input) {
  // Per-rank loads are allocated from num_ranks: bound it first.
  if (input.num_ranks < 0 || input.num_ranks > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("num_ranks ", input.num_ranks,
                                                   " is outside [0, ", kMaxWorldSize,
                                                   "] (the limit on ranks)"));
  }
  if (input.shards.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("too many shards (at most 2^31 - 1)");
  }
  int64_t total_bytes = 0;
  for (const DistributablePiece& s : input.shards) {
    if (!s.size_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", s.id.DebugString(), " has no size"));
    }
    if (*s.size_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", s.id.DebugString(), " has negative size ", *s.size_bytes));
    }
    // Every rank's load is a sum of sizes: keep the total within int64.
    if (*s.size_bytes > std::numeric_limits<int64_t>::max() - total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", s.id.DebugString(), " of ", *s.size_bytes,
                       " bytes brings the total of all shard sizes past 2^63 - 1 bytes"));
    }
    total_bytes += *s.size_bytes;
    if (s.holder_list < 0 || static_cast<size_t>(s.holder_list) >= input.holder_lists.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", s.id.DebugString(), " refers to missing holder list ", s.holder_list));
    }
    const auto& holders = input.holder_lists[s.holder_list];
    if (holders.size() >= (size_t{1} << 31)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", s.id.DebugString(), " has too many holders"));
    }
    if (std::none_of(holders.begin(), holders.end(),
                     [&](int64_t r) { return r >= 0 && r < input.num_ranks; })) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", s.id.DebugString(),
                                                     " has no holder in [0, ", input.num_ranks,
                                                     ") (holders given: ", holders.size(), ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// The compact form's own structure: every range inside its array (built by code, not read
// from users, but checked so that no input can make the planner read out of bounds).
absl::Status CheckCompactStructure(const CompactDistributionInput& input) {
  const auto& starts = input.list_start;
  if (starts.empty() || starts.front() != 0 ||
      starts.back() > static_cast<int64_t>(input.holders.size()) ||
      !std::is_sorted(starts.begin(), starts.end())) {
    return absl::InvalidArgumentError("malformed compact input: holder list ranges");
  }
  const int64_t num_lists = static_cast<int64_t>(starts.size()) - 1;
  const int64_t num_offsets = static_cast<int64_t>(input.offsets.size());
  for (size_t i = 0; i < input.shards.size(); ++i) {
    const CompactDistributionInput::Shard& s = input.shards[i];
    if (s.key < 0 || static_cast<size_t>(s.key) >= input.keys.size() || s.num_offsets < 0 ||
        s.offsets_start < 0 || s.offsets_start > num_offsets - s.num_offsets || s.flat < -1 ||
        (s.flat >= 0 && static_cast<size_t>(s.flat) >= input.flats.size()) || s.holder_list < 0 ||
        s.holder_list >= num_lists) {
      return absl::InvalidArgumentError(absl::StrCat("malformed compact input: shard ", i));
    }
  }
  return absl::OkStatus();
}

// The sum of input.initial_bytes, checked (one entry per rank, none negative, no overflow).
absl::StatusOr<int64_t> InitialBytesTotal(const CompactDistributionInput& input) {
  if (input.initial_bytes.empty()) return 0;
  if (static_cast<int64_t>(input.initial_bytes.size()) != input.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial bytes given for ", input.initial_bytes.size(), " ranks, not ", input.num_ranks));
  }
  int64_t total = 0;
  for (size_t r = 0; r < input.initial_bytes.size(); ++r) {
    const int64_t bytes = input.initial_bytes[r];
    if (bytes < 0 || bytes > std::numeric_limits<int64_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, "'s initial bytes ", bytes,
                       bytes < 0 ? " are negative" : " bring the total past 2^63 - 1 bytes"));
    }
    total += bytes;
  }
  return total;
}

}  // namespace

absl::Status ValidateDistributionInput(const CompactDistributionInput& input) {
  if (input.num_ranks < 0 || input.num_ranks > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("num_ranks ", input.num_ranks,
                                                   " is outside [0, ", kMaxWorldSize,
                                                   "] (the limit on ranks)"));
  }
  if (input.shards.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("too many shards (at most 2^31 - 1)");
  }
  CKPT_RETURN_IF_ERROR(CheckCompactStructure(input));
  // Per list: 0 not looked at yet, 1 has a holder in [0, num_ranks), 2 has none.
  std::vector<uint8_t> list_state(input.list_start.size() - 1, 0);
  CKPT_ASSIGN_OR_RETURN(int64_t total_bytes, InitialBytesTotal(input));
  for (size_t i = 0; i < input.shards.size(); ++i) {
    const CompactDistributionInput::Shard& s = input.shards[i];
    const auto id = [&] { return input.IdOf(static_cast<int32_t>(i)).DebugString(); };
    if (s.size_bytes == CompactDistributionInput::kNoSize) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", id(), " has no size"));
    }
    if (s.size_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", id(), " has negative size ", s.size_bytes));
    }
    if (s.size_bytes > std::numeric_limits<int64_t>::max() - total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", id(), " of ", s.size_bytes,
                       " bytes brings the total of all shard sizes past 2^63 - 1 bytes"));
    }
    total_bytes += s.size_bytes;
    const int64_t begin = input.list_start[s.holder_list];
    const int64_t count = input.list_start[s.holder_list + 1] - begin;
    if (count >= (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", id(), " has too many holders"));
    }
    uint8_t& state = list_state[s.holder_list];
    if (state == 0) {
      const int32_t* h = input.holders.data() + begin;
      state = std::any_of(h, h + count, [&](int32_t r) { return r >= 0 && r < input.num_ranks; })
                  ? 1
                  : 2;
    }
    if (state == 2) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", id(), " has no holder in [0, ",
                                                     input.num_ranks, ") (holders given: ", count,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDistinctIds(const DistributionInput& input) {
  absl::flat_hash_set<const PieceId*, PieceIdPtrHash, PieceIdPtrEq> seen;
  seen.reserve(input.shards.size());
  for (const DistributablePiece& s : input.shards) {
    if (!seen.insert(&s.id).second) return RepeatedShardError(s.id);
  }
  return absl::OkStatus();
}

}  // namespace internal

namespace {

// Holder sets at most this large are scanned per shard; larger ones shared by several shards
// get a lazily-invalidated heap.
constexpr size_t kScanThreshold = 24;
constexpr int64_t kMinShardsForHeap = 4;

using Shard = CompactDistributionInput::Shard;

// Shard ids of the compact form, compared as Python compares them.
class CompactIds {
 public:
  explicit CompactIds(const CompactDistributionInput& input) : input_(input) {}

  absl::Span<const int64_t> Offsets(const Shard& s) const {
    return absl::Span<const int64_t>(input_.offsets.data() + s.offsets_start,
                                     static_cast<size_t>(s.num_offsets));
  }

  // Python's order of ids that share a key: offsets (shorter prefix first), then None before
  // any range, then (start, stop). Ties broken by index so repeated ids end up adjacent.
  bool SameKeyLess(int32_t a, int32_t b) const {
    const Shard& x = input_.shards[a];
    const Shard& y = input_.shards[b];
    const absl::Span<const int64_t> xo = Offsets(x), yo = Offsets(y);
    const size_t n = std::min(xo.size(), yo.size());
    for (size_t i = 0; i < n; ++i) {
      if (xo[i] != yo[i]) return xo[i] < yo[i];
    }
    if (xo.size() != yo.size()) return xo.size() < yo.size();
    if ((x.flat >= 0) != (y.flat >= 0)) return x.flat < 0;
    if (x.flat >= 0) {
      const FlatRange& fx = input_.flats[x.flat];
      const FlatRange& fy = input_.flats[y.flat];
      if (fx.start != fy.start) return fx.start < fy.start;
      if (fx.stop != fy.stop) return fx.stop < fy.stop;
    }
    return a < b;
  }

  // Equal ids, given equal keys.
  bool SameKeyEqual(int32_t a, int32_t b) const {
    const Shard& x = input_.shards[a];
    const Shard& y = input_.shards[b];
    if ((x.flat >= 0) != (y.flat >= 0) || Offsets(x) != Offsets(y)) return false;
    return x.flat < 0 || input_.flats[x.flat] == input_.flats[y.flat];
  }

  // Python's TypeError, given equal keys: equal offsets, and a range against None.
  bool SameKeyIncomparable(int32_t a, int32_t b) const {
    const Shard& x = input_.shards[a];
    const Shard& y = input_.shards[b];
    return (x.flat >= 0) != (y.flat >= 0) && Offsets(x) == Offsets(y);
  }

 private:
  const CompactDistributionInput& input_;
};

// ordinal[k]: the position of keys[k] among the distinct key strings in byte order (equal
// strings get equal ordinals), so the sorts compare integers instead of strings.
std::vector<int32_t> KeyOrdinals(const std::vector<std::string_view>& keys) {
  const int32_t num_keys = static_cast<int32_t>(keys.size());
  std::vector<int32_t> by_key(num_keys);
  for (int32_t i = 0; i < num_keys; ++i) by_key[i] = i;
  // std::string_view compares as unsigned char: UTF-8 byte order = code point order.
  std::sort(by_key.begin(), by_key.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
  std::vector<int32_t> ordinal(num_keys);
  int32_t next = -1;
  for (int32_t i = 0; i < num_keys; ++i) {
    if (i == 0 || keys[by_key[i]] != keys[by_key[i - 1]]) ++next;
    ordinal[by_key[i]] = next;
  }
  return ordinal;
}

// Sorts `bucket` (shards of one key) by SameKeyLess. Shards of a key usually have a few
// distinct offsets (one per tensor-parallel slice) and many flat ranges (one per data-parallel
// rank): the offsets are ranked once and the shards sorted as plain tuples, not by comparing
// offsets through the input per comparison (a tenth of a 100k-rank save's planning). With
// many distinct offsets, SameKeyLess itself.
void SortBucket(const CompactIds& ids, const CompactDistributionInput& input,
                std::vector<int32_t>::iterator begin, std::vector<int32_t>::iterator end) {
  constexpr size_t kMostDistinctOffsets = 64;
  std::vector<int32_t> distinct;  // a shard of each distinct offsets, in first-seen order
  std::vector<int32_t> offsets_of(end - begin);
  for (auto it = begin; it != end; ++it) {
    const absl::Span<const int64_t> o = ids.Offsets(input.shards[*it]);
    size_t d = 0;
    while (d < distinct.size() && ids.Offsets(input.shards[distinct[d]]) != o) ++d;
    if (d == distinct.size()) {
      if (distinct.size() == kMostDistinctOffsets) {
        std::sort(begin, end, [&](int32_t a, int32_t b) { return ids.SameKeyLess(a, b); });
        return;
      }
      distinct.push_back(*it);
    }
    offsets_of[it - begin] = static_cast<int32_t>(d);
  }
  std::vector<int32_t> order(distinct.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int32_t>(d);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const absl::Span<const int64_t> x = ids.Offsets(input.shards[distinct[a]]);
    const absl::Span<const int64_t> y = ids.Offsets(input.shards[distinct[b]]);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  });
  std::vector<int32_t> rank(distinct.size());
  for (size_t k = 0; k < order.size(); ++k) rank[order[k]] = static_cast<int32_t>(k);
  // (offsets rank, has a range, start, stop, index): SameKeyLess's order.
  using Key = std::tuple<int32_t, bool, int64_t, int64_t, int32_t>;
  std::vector<Key> keys;
  keys.reserve(end - begin);
  for (auto it = begin; it != end; ++it) {
    const Shard& s = input.shards[*it];
    const FlatRange range = s.flat >= 0 ? input.flats[s.flat] : FlatRange{0, 0};
    keys.emplace_back(rank[offsets_of[it - begin]], s.flat >= 0, range.start, range.stop, *it);
  }
  std::sort(keys.begin(), keys.end());
  for (size_t k = 0; k < keys.size(); ++k) *(begin + k) = std::get<4>(keys[k]);
}

// The shards in id order: bucketed by key ordinal (counting sort), then each bucket sorted
// unless it already is (ids usually come in order within a key). Fails on the lowest-index
// shard whose id occurred at a lower index.
absl::StatusOr<std::vector<int32_t>> IdOrder(const CompactDistributionInput& input,
                                             const std::vector<int32_t>& ordinal) {
  const auto& shards = input.shards;
  const int32_t num_shards = static_cast<int32_t>(shards.size());
  const int32_t num_buckets = static_cast<int32_t>(ordinal.size());
  std::vector<int32_t> bucket_start(num_buckets + 1, 0);
  for (const Shard& s : shards) ++bucket_start[ordinal[s.key] + 1];
  for (int32_t k = 0; k < num_buckets; ++k) bucket_start[k + 1] += bucket_start[k];
  std::vector<int32_t> by_id(num_shards);
  {
    std::vector<int32_t> next(bucket_start.begin(), bucket_start.end() - 1);
    for (int32_t i = 0; i < num_shards; ++i) by_id[next[ordinal[shards[i].key]]++] = i;
  }
  const CompactIds ids(input);
  const auto less = [&](int32_t a, int32_t b) { return ids.SameKeyLess(a, b); };
  int32_t repeated = -1;  // lowest index whose id occurred at a lower index
  for (int32_t k = 0; k < num_buckets; ++k) {
    auto begin = by_id.begin() + bucket_start[k], end = by_id.begin() + bucket_start[k + 1];
    if (end - begin < 2) continue;
    if (!std::is_sorted(begin, end, less)) SortBucket(ids, input, begin, end);
    for (auto it = begin + 1; it != end; ++it) {
      if (ids.SameKeyEqual(*(it - 1), *it) && (repeated < 0 || *it < repeated)) repeated = *it;
    }
  }
  if (repeated >= 0) return internal::RepeatedShardError(input.IdOf(repeated));
  return by_id;
}

// The holder lists of the compact form.
class FlatHolderLists {
 public:
  explicit FlatHolderLists(const CompactDistributionInput& input) : input_(input) {}
  size_t size() const { return input_.list_start.size() - 1; }
  absl::Span<const int32_t> operator[](int32_t l) const {
    const int64_t begin = input_.list_start[l];
    return absl::Span<const int32_t>(input_.holders.data() + begin,
                                     static_cast<size_t>(input_.list_start[l + 1] - begin));
  }

 private:
  const CompactDistributionInput& input_;
};

// The holder lists of a DistributionInput, read where they are (large per-shard lists are
// not copied).
class VectorHolderLists {
 public:
  explicit VectorHolderLists(const std::vector<std::vector<int64_t>>& lists) : lists_(lists) {}
  size_t size() const { return lists_.size(); }
  absl::Span<const int64_t> operator[](int32_t l) const { return lists_[l]; }

 private:
  const std::vector<std::vector<int64_t>>& lists_;
};

// One shard's place in the visiting order: (cross, len(holders)) as `group` and the size as
// INT64_MAX - size (which grows as the size shrinks); ties keep id order. It carries where
// its holders are, so that the greedy pass reads nothing else per shard but them.
template <typename Rank>
struct VisitItem {
  uint64_t size_key;
  const Rank* holders;
  uint32_t group;
  int32_t shard;
};

// An array of `n` trivially constructible values, not zero-filled first.
template <typename T>
std::unique_ptr<T[]> UninitializedArray(size_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

// One stable counting-sort pass of items[0, n) into `scratch` by an 11-bit digit; swaps them.
template <typename Item, typename Digit>
void RadixPass(std::unique_ptr<Item[]>& items, std::unique_ptr<Item[]>& scratch, size_t n,
               Digit digit) {
  constexpr uint32_t kBuckets = 1 << 11;
  uint32_t start[kBuckets] = {};
  for (size_t i = 0; i < n; ++i) ++start[digit(items[i])];
  uint32_t sum = 0;
  for (uint32_t& c : start) sum += std::exchange(c, sum);
  for (size_t i = 0; i < n; ++i) scratch[start[digit(items[i])]++] = items[i];
  items.swap(scratch);
}

// Stable LSD radix sort of items[0, n) by (group, size_key), over the 11-bit digits in which
// keys differ (usually 2-4 passes); std::stable_sort for small inputs.
template <typename Item>
void SortVisitItems(std::unique_ptr<Item[]>& items, size_t n) {
  if (n < 2048) {
    std::stable_sort(items.get(), items.get() + n, [](const Item& a, const Item& b) {
      return a.group != b.group ? a.group < b.group : a.size_key < b.size_key;
    });
    return;
  }
  uint64_t any_size = 0, all_size = ~uint64_t{0};
  uint32_t any_group = 0, all_group = ~uint32_t{0};
  for (size_t i = 0; i < n; ++i) {
    any_size |= items[i].size_key;
    all_size &= items[i].size_key;
    any_group |= items[i].group;
    all_group &= items[i].group;
  }
  std::unique_ptr<Item[]> scratch = UninitializedArray<Item>(n);
  constexpr uint64_t kMask = (1 << 11) - 1;
  for (uint64_t varying = any_size ^ all_size; varying != 0;) {
    const int shift = __builtin_ctzll(varying);
    RadixPass(items, scratch, n, [shift](const Item& v) { return (v.size_key >> shift) & kMask; });
    varying = shift + 11 >= 64 ? 0 : varying & ~((uint64_t{1} << (shift + 11)) - 1);
  }
  for (uint64_t varying = any_group ^ all_group; varying != 0;) {
    const int shift = __builtin_ctzll(varying);
    RadixPass(items, scratch, n, [shift](const Item& v) { return (v.group >> shift) & kMask; });
    varying = shift + 11 >= 64 ? 0 : varying & ~((uint64_t{1} << (shift + 11)) - 1);
  }
}

// The shards in visiting order, and what the greedy pass needs to know about all of them.
template <typename Rank>
struct Visits {
  std::unique_ptr<VisitItem<Rank>[]> items;
  size_t size = 0;
  uint32_t count_mask = 0;   // group & count_mask = len(holders)
  bool mixed_flats = false;  // some ids have a flat range and some have None
};

// The visiting order: (cross, len(holders), -size, id), sorted stably from id order.
template <typename Lists>
auto VisitOrder(const CompactDistributionInput& input, const Lists& lists,
                const std::vector<int32_t>& by_id) {
  using Rank =
      typename std::remove_const_t<typename std::remove_pointer_t<decltype(lists[0].data())>>;
  // group = cross above the bits that len(holders) needs (validated < 2^31).
  int64_t max_holders = 0;
  bool any_flat = false, any_none = false;
  for (const Shard& s : input.shards) {
    max_holders = std::max(max_holders, static_cast<int64_t>(lists[s.holder_list].size()));
    (s.flat >= 0 ? any_flat : any_none) = true;
  }
  const int cross_shift = 64 - __builtin_clzll(static_cast<uint64_t>(max_holders) | 1);
  Visits<Rank> visits;
  visits.size = by_id.size();
  visits.count_mask = (uint32_t{1} << cross_shift) - 1;
  visits.mixed_flats = any_flat && any_none;
  visits.items = UninitializedArray<VisitItem<Rank>>(visits.size);
  for (size_t r = 0; r < by_id.size(); ++r) {
    const Shard& s = input.shards[by_id[r]];
    const auto holders = lists[s.holder_list];
    const uint32_t group =
        (uint32_t{s.cross_group} << cross_shift) | static_cast<uint32_t>(holders.size());
    visits.items[r] =
        VisitItem<Rank>{static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - s.size_bytes),
                        holders.data(), group, by_id[r]};
  }
  SortVisitItems(visits.items, visits.size);
  return visits;
}

// Loads of all ranks plus lazily-invalidated min-heaps of (load, rank), one per large holder
// set. Each heap holds exactly one entry per member rank; an entry is stale when its load is
// below the rank's current load (loads never decrease), and is refreshed when it surfaces.
class LoadTracker {
 public:
  explicit LoadTracker(int64_t num_ranks) : load_(num_ranks, 0) {}

  void Add(int32_t rank, int64_t bytes) { load_[rank] += bytes; }

  // Smallest (load, rank) among the valid ranks of `holders` by scanning.
  template <typename Rank>
  int32_t ScanMin(absl::Span<const Rank> holders) const {
    int32_t best = -1;
    const uint64_t n = load_.size();
    for (const Rank r : holders) {
      if (static_cast<uint64_t>(r) >= n) continue;  // also negative ranks
      const int32_t rank = static_cast<int32_t>(r);
      if (best < 0 || load_[rank] < load_[best] || (load_[rank] == load_[best] && rank < best)) {
        best = rank;
      }
    }
    return best;
  }

  using Entry = std::pair<int64_t, int32_t>;  // (load, rank); min-heap via std::greater

  static std::vector<Entry> MakeHeap(absl::Span<const int32_t> members, const LoadTracker& t) {
    std::vector<Entry> heap;
    heap.reserve(members.size());
    for (int32_t r : members) heap.emplace_back(t.load_[r], r);
    std::make_heap(heap.begin(), heap.end(), std::greater<Entry>());
    return heap;
  }

  int32_t HeapMin(std::vector<Entry>& heap) const {
    while (heap.front().first != load_[heap.front().second]) {
      const int32_t r = heap.front().second;
      std::pop_heap(heap.begin(), heap.end(), std::greater<Entry>());
      heap.back() = Entry(load_[r], r);
      std::push_heap(heap.begin(), heap.end(), std::greater<Entry>());
    }
    return heap.front().second;
  }

 private:
  std::vector<int64_t> load_;
};

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    return absl::Hash<std::vector<int32_t>>()(v);
  }
};

// Large holder lists grouped by their canonical set (sorted distinct valid ranks): the
// minimum of (load, rank) depends on nothing else. set_of_list[l] is kScan for lists scanned
// per shard (small, or whose set too few shards share).
struct HolderSets {
  static constexpr int32_t kScan = -1;
  std::vector<int32_t> set_of_list;
  std::vector<std::vector<int32_t>> members;
  std::vector<int64_t> uses;  // shards left to visit per set
};

template <typename Lists>
HolderSets GroupHolderSets(const CompactDistributionInput& input, const Lists& lists) {
  const size_t num_lists = lists.size();
  HolderSets sets;
  sets.set_of_list.assign(num_lists, HolderSets::kScan);
  std::vector<int64_t> uses_of_list(num_lists, 0);
  for (const Shard& s : input.shards) {
    if (lists[s.holder_list].size() > kScanThreshold) ++uses_of_list[s.holder_list];
  }
  absl::flat_hash_map<std::vector<int32_t>, int32_t, VectorHash> set_index;
  for (size_t l = 0; l < num_lists; ++l) {
    if (uses_of_list[l] == 0) continue;
    std::vector<int32_t> members;
    members.reserve(lists[static_cast<int32_t>(l)].size());
    for (const auto r : lists[static_cast<int32_t>(l)]) {
      if (r >= 0 && r < input.num_ranks) members.push_back(static_cast<int32_t>(r));
    }
    // Lists gathered in rank order are already sorted; only sort the others.
    if (!std::is_sorted(members.begin(), members.end())) std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());
    if (members.size() <= kScanThreshold) continue;
    auto [it, inserted] = set_index.try_emplace(members, static_cast<int32_t>(sets.members.size()));
    if (inserted) {
      sets.members.push_back(std::move(members));
      sets.uses.push_back(0);
    }
    sets.set_of_list[l] = it->second;
    sets.uses[it->second] += uses_of_list[l];
  }
  for (int32_t& set : sets.set_of_list) {
    // A heap pays off only when several shards share the set; otherwise scan the list.
    if (set != HolderSets::kScan && sets.uses[set] < kMinShardsForHeap) set = HolderSets::kScan;
  }
  return sets;
}

// Python's TypeError: a None/range pair tying on the earlier fields ends up adjacent in the
// visiting order (None sorts first) and cannot be compared. Only inputs with both kinds of
// ids can have one.
template <typename Rank>
absl::Status CheckComparable(const CompactDistributionInput& input, const Visits<Rank>& visits,
                             const std::vector<int32_t>& ordinal) {
  if (!visits.mixed_flats) return absl::OkStatus();
  const CompactIds ids(input);
  for (size_t i = 1; i < visits.size; ++i) {
    const VisitItem<Rank>& a = visits.items[i - 1];
    const VisitItem<Rank>& b = visits.items[i];
    if (a.group == b.group && a.size_key == b.size_key &&
        ordinal[input.shards[a.shard].key] == ordinal[input.shards[b.shard].key] &&
        ids.SameKeyIncomparable(a.shard, b.shard)) {
      return internal::IncomparableShardsError(input.IdOf(a.shard), input.IdOf(b.shard));
    }
  }
  return absl::OkStatus();
}

// Megatron's greedy pass over the visiting order: each shard to the holder with the least
// (bytes so far, rank).
template <typename Lists, typename Rank>
std::vector<ShardAssignment> AssignInOrder(const CompactDistributionInput& input,
                                           const Lists& lists, const Visits<Rank>& visits) {
  HolderSets sets = GroupHolderSets(input, lists);
  LoadTracker loads(input.num_ranks);
  for (size_t r = 0; r < input.initial_bytes.size(); ++r) {
    loads.Add(static_cast<int32_t>(r), input.initial_bytes[r]);
  }
  std::vector<std::vector<LoadTracker::Entry>> heaps(sets.members.size());
  std::vector<ShardAssignment> result(visits.size);
  const size_t n = visits.size;
  constexpr size_t kPrefetch = 8;
  for (size_t i = 0; i < n; ++i) {
    // Visiting order jumps around memory: fetch holder lists (or a large list's shard, for
    // its set) ahead of use.
    if (i + kPrefetch < n) {
      const VisitItem<Rank>& ahead = visits.items[i + kPrefetch];
      if ((ahead.group & visits.count_mask) <= kScanThreshold) {
        __builtin_prefetch(ahead.holders);
      } else {
        __builtin_prefetch(&input.shards[ahead.shard]);
      }
    }
    const VisitItem<Rank>& v = visits.items[i];
    const size_t count = v.group & visits.count_mask;
    const int32_t set = count <= kScanThreshold
                            ? HolderSets::kScan
                            : sets.set_of_list[input.shards[v.shard].holder_list];
    int32_t rank;
    if (set == HolderSets::kScan) {
      rank = loads.ScanMin(absl::Span<const Rank>(v.holders, count));
    } else {
      auto& heap = heaps[set];
      if (heap.empty()) heap = LoadTracker::MakeHeap(sets.members[set], loads);
      rank = loads.HeapMin(heap);
      if (--sets.uses[set] == 0) {  // last shard of this set: free its heap
        std::vector<LoadTracker::Entry>().swap(heap);
        std::vector<int32_t>().swap(sets.members[set]);
      }
    }
    loads.Add(rank, std::numeric_limits<int64_t>::max() - static_cast<int64_t>(v.size_key));
    result[i] = ShardAssignment{v.shard, rank};
  }
  return result;
}

// The distribution of a validated input: `input`'s shards over `lists`.
template <typename Lists>
absl::StatusOr<std::vector<ShardAssignment>> DistributeValidated(
    const CompactDistributionInput& input, const Lists& lists) {
  const std::vector<int32_t> ordinal = KeyOrdinals(input.keys);
  CKPT_ASSIGN_OR_RETURN(std::vector<int32_t> by_id, IdOrder(input, ordinal));
  const auto visits = VisitOrder(input, lists, by_id);
  std::vector<int32_t>().swap(by_id);
  CKPT_RETURN_IF_ERROR(CheckComparable(input, visits, ordinal));
  return AssignInOrder(input, lists, visits);
}

// `input`'s shards in the compact form, without the holder lists (holders and list_start
// are left empty: the caller reads input.holder_lists in place).
CompactDistributionInput CompactShardsOf(const DistributionInput& input) {
  CompactDistributionInput out;
  out.num_ranks = input.num_ranks;
  absl::flat_hash_map<std::string_view, int32_t> key_index;
  out.shards.reserve(input.shards.size());
  for (const DistributablePiece& piece : input.shards) {
    CompactDistributionInput::Shard s;
    s.size_bytes = piece.size_bytes.value_or(CompactDistributionInput::kNoSize);
    s.offsets_start = static_cast<int64_t>(out.offsets.size());
    s.num_offsets = static_cast<int32_t>(piece.id.offsets.size());
    out.offsets.insert(out.offsets.end(), piece.id.offsets.begin(), piece.id.offsets.end());
    const std::string_view key = piece.id.key;
    if (!out.shards.empty() && out.keys[out.shards.back().key] == key) {
      s.key = out.shards.back().key;  // consecutive shards usually share a key
    } else {
      auto [it, inserted] = key_index.try_emplace(key, static_cast<int32_t>(out.keys.size()));
      if (inserted) out.keys.push_back(key);
      s.key = it->second;
    }
    s.holder_list = piece.holder_list;
    if (piece.id.flat) {
      s.flat = static_cast<int32_t>(out.flats.size());
      out.flats.push_back(*piece.id.flat);
    }
    s.cross_group = piece.cross_group;
    out.shards.push_back(s);
  }
  return out;
}

}  // namespace

CompactDistributionInput ToCompactDistributionInput(const DistributionInput& input) {
  CompactDistributionInput out = CompactShardsOf(input);
  size_t total_holders = 0;
  for (const auto& holders : input.holder_lists) total_holders += holders.size();
  out.holders.reserve(total_holders);
  out.list_start.reserve(input.holder_lists.size() + 1);
  for (const auto& holders : input.holder_lists) {
    for (int64_t r : holders) {
      out.holders.push_back(r >= 0 && r < input.num_ranks ? static_cast<int32_t>(r) : -1);
    }
    out.list_start.push_back(static_cast<int64_t>(out.holders.size()));
  }
  return out;
}

PieceId CompactDistributionInput::IdOf(int32_t shard) const {
  const Shard& s = shards[shard];
  PieceId id;
  id.key = std::string(keys[s.key]);
  id.offsets.assign(offsets.begin() + s.offsets_start,
                    offsets.begin() + s.offsets_start + s.num_offsets);
  if (s.flat >= 0) id.flat = flats[s.flat];
  return id;
}

absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanks(
    const DistributionInput& input) {
  CKPT_RETURN_IF_ERROR(internal::ValidateDistributionInput(input));
  return DistributeValidated(CompactShardsOf(input), VectorHolderLists(input.holder_lists));
}

absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanks(
    const CompactDistributionInput& input) {
  CKPT_RETURN_IF_ERROR(internal::ValidateDistributionInput(input));
  return DistributeValidated(input, FlatHolderLists(input));
}

absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanksReference(
    const DistributionInput& input) {
  CKPT_RETURN_IF_ERROR(internal::ValidateDistributionInput(input));
  CKPT_RETURN_IF_ERROR(internal::CheckDistinctIds(input));
  const auto& shards = input.shards;
  std::vector<int32_t> order(shards.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  // The full Python sort key, compared field by field.
  auto compare = [&](int32_t a, int32_t b, bool* incomparable) -> int {
    *incomparable = false;
    const DistributablePiece& x = shards[a];
    const DistributablePiece& y = shards[b];
    if (x.cross_group != y.cross_group) return x.cross_group ? 1 : -1;
    const size_t nx = input.holder_lists[x.holder_list].size();
    const size_t ny = input.holder_lists[y.holder_list].size();
    if (nx != ny) return nx < ny ? -1 : 1;
    if (*x.size_bytes != *y.size_bytes) return -*x.size_bytes < -*y.size_bytes ? -1 : 1;
    return ComparePieceIds(x.id, y.id, incomparable);
  };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    bool incomparable = false;
    return compare(a, b, &incomparable) < 0;
  });
  // Any None/range pair tying on the earlier fields ends up adjacent; report the first one.
  for (size_t i = 1; i < order.size(); ++i) {
    bool incomparable = false;
    compare(order[i - 1], order[i], &incomparable);
    if (incomparable) {
      return internal::IncomparableShardsError(shards[order[i - 1]].id, shards[order[i]].id);
    }
  }
  std::vector<int64_t> load(input.num_ranks, 0);
  std::vector<ShardAssignment> result;
  result.reserve(order.size());
  for (int32_t shard : order) {
    const DistributablePiece& s = shards[shard];
    int64_t best = -1;
    for (int64_t r : input.holder_lists[s.holder_list]) {
      if (r < 0 || r >= input.num_ranks) continue;
      if (best < 0 || std::make_pair(load[r], r) < std::make_pair(load[best], best)) best = r;
    }
    load[best] += *s.size_bytes;
    result.push_back(ShardAssignment{shard, best});
  }
  return result;
}

}  // namespace ckpt
