#include "planner/distribute.h"

#include <algorithm>
#include <limits>
#include <string_view>
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

// Sort key of one shard: Python's key with the shard id replaced by its rank in id order.
struct VisitKey {
  uint64_t num_holders;
  int64_t neg_size;
  int32_t id_rank;
  int32_t shard;
  int32_t key_ordinal;
  int32_t holder_list;
  uint8_t cross;
};

// Python's order of ids that share a key: offsets (shorter prefix first), then None before
// any range, then (start, stop). Ties broken by index so duplicates end up adjacent.
bool SameKeyIdLess(const PieceId& x, int32_t xi, const PieceId& y, int32_t yi) {
  const size_t n = std::min(x.offsets.size(), y.offsets.size());
  for (size_t i = 0; i < n; ++i) {
    if (x.offsets[i] != y.offsets[i]) return x.offsets[i] < y.offsets[i];
  }
  if (x.offsets.size() != y.offsets.size()) return x.offsets.size() < y.offsets.size();
  if (x.flat.has_value() != y.flat.has_value()) return !x.flat.has_value();
  if (x.flat && x.flat->start != y.flat->start) return x.flat->start < y.flat->start;
  if (x.flat && x.flat->stop != y.flat->stop) return x.flat->stop < y.flat->stop;
  return xi < yi;
}

// Sorts 128-bit keys: LSD radix over the 16-bit digits that differ between keys (usually 4-6
// of 8), falling back to std::sort for small inputs.
void SortPacked(std::vector<unsigned __int128>& keys) {
  using Packed = unsigned __int128;
  if (keys.size() < 4096) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  Packed any = 0, all = ~Packed{0};
  for (const Packed& k : keys) {
    any |= k;
    all &= k;
  }
  const Packed varying = any ^ all;
  std::vector<Packed> scratch(keys.size());
  std::vector<uint32_t> start(1 << 16);
  for (int shift = 0; shift < 128; shift += 16) {
    if (((varying >> shift) & 0xFFFF) == 0) continue;
    std::fill(start.begin(), start.end(), 0);
    for (const Packed& k : keys) ++start[static_cast<uint32_t>(k >> shift) & 0xFFFF];
    uint32_t sum = 0;
    for (uint32_t& c : start) sum += std::exchange(c, sum);
    for (const Packed& k : keys) scratch[start[static_cast<uint32_t>(k >> shift) & 0xFFFF]++] = k;
    keys.swap(scratch);
  }
}

// Each shard's key as an integer: key_of_shard[i] indexes the distinct keys in first-seen order
// and ordinal[k] is key k's position in sorted order, so the sorts compare integers instead of
// strings.
struct KeyRanks {
  std::vector<int32_t> key_of_shard;
  std::vector<int32_t> ordinal;
};

KeyRanks RankKeys(const std::vector<DistributablePiece>& shards) {
  const int32_t num_shards = static_cast<int32_t>(shards.size());
  KeyRanks ranks;
  absl::flat_hash_map<std::string_view, int32_t> key_index;
  std::vector<std::string_view> keys;
  ranks.key_of_shard.resize(num_shards);
  for (int32_t i = 0; i < num_shards; ++i) {
    auto [it, inserted] =
        key_index.try_emplace(shards[i].id.key, static_cast<int32_t>(keys.size()));
    if (inserted) keys.push_back(shards[i].id.key);
    ranks.key_of_shard[i] = it->second;
  }
  key_index.clear();
  const int32_t num_keys = static_cast<int32_t>(keys.size());
  std::vector<int32_t> by_key(num_keys);
  for (int32_t i = 0; i < num_keys; ++i) by_key[i] = i;
  // std::string_view compares as unsigned char: UTF-8 byte order = code point order.
  std::sort(by_key.begin(), by_key.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
  ranks.ordinal.resize(num_keys);
  for (int32_t i = 0; i < num_keys; ++i) ranks.ordinal[by_key[i]] = i;
  return ranks;
}

// The shards in id order: bucketed by key ordinal (counting sort), then each bucket sorted.
// Fails on the lowest-index shard whose id occurred at a lower index.
absl::StatusOr<std::vector<int32_t>> IdOrder(const std::vector<DistributablePiece>& shards,
                                             const KeyRanks& ranks) {
  const int32_t num_shards = static_cast<int32_t>(shards.size());
  const int32_t num_keys = static_cast<int32_t>(ranks.ordinal.size());
  std::vector<int32_t> bucket_start(num_keys + 1, 0);
  for (int32_t i = 0; i < num_shards; ++i) ++bucket_start[ranks.ordinal[ranks.key_of_shard[i]] + 1];
  for (int32_t k = 0; k < num_keys; ++k) bucket_start[k + 1] += bucket_start[k];
  std::vector<int32_t> by_id(num_shards);
  {
    std::vector<int32_t> next(bucket_start.begin(), bucket_start.end() - 1);
    for (int32_t i = 0; i < num_shards; ++i)
      by_id[next[ranks.ordinal[ranks.key_of_shard[i]]]++] = i;
  }
  int32_t repeated = -1;  // lowest index whose id occurred at a lower index
  for (int32_t k = 0; k < num_keys; ++k) {
    auto begin = by_id.begin() + bucket_start[k], end = by_id.begin() + bucket_start[k + 1];
    if (end - begin > 1) {
      std::sort(begin, end, [&](int32_t a, int32_t b) {
        return SameKeyIdLess(shards[a].id, a, shards[b].id, b);
      });
      for (auto it = begin + 1; it != end; ++it) {
        if (shards[*(it - 1)].id == shards[*it].id && (repeated < 0 || *it < repeated)) {
          repeated = *it;
        }
      }
    }
  }
  if (repeated >= 0) return internal::RepeatedShardError(shards[repeated].id);
  return by_id;
}

// The visiting order: (cross, len(holders), -size, id rank) packed into one 128-bit integer so
// the big sort moves and compares 16-byte keys: [cross:1][holders:31][size key:64][id rank:32],
// where the size key INT64_MAX - size grows as the size shrinks.
std::vector<VisitKey> SortByVisit(const DistributionInput& input, const std::vector<int32_t>& by_id,
                                  const KeyRanks& ranks) {
  const auto& shards = input.shards;
  const int32_t num_shards = static_cast<int32_t>(shards.size());
  using Packed = unsigned __int128;
  std::vector<Packed> packed(num_shards);
  for (int32_t r = 0; r < num_shards; ++r) {
    const DistributablePiece& s = shards[by_id[r]];
    const uint64_t hi = (uint64_t{s.cross_group} << 63) |
                        (uint64_t{input.holder_lists[s.holder_list].size()} << 32);
    const uint64_t size_key =
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - *s.size_bytes);
    packed[r] = (Packed{hi} << 64 | Packed{size_key} << 32) + static_cast<uint32_t>(r);
  }
  SortPacked(packed);
  std::vector<VisitKey> order(num_shards);
  for (int32_t v = 0; v < num_shards; ++v) {
    const int32_t i = by_id[static_cast<uint32_t>(packed[v])];
    const DistributablePiece& s = shards[i];
    order[v] = VisitKey{input.holder_lists[s.holder_list].size(),
                        -*s.size_bytes,
                        static_cast<int32_t>(static_cast<uint32_t>(packed[v])),
                        i,
                        ranks.ordinal[ranks.key_of_shard[i]],
                        s.holder_list,
                        static_cast<uint8_t>(s.cross_group ? 1 : 0)};
  }
  return order;
}

// Python's TypeError: a None/range pair tying on the earlier fields ends up adjacent (None
// sorts first) and cannot be compared.
absl::Status CheckComparable(const std::vector<DistributablePiece>& shards,
                             const std::vector<VisitKey>& order) {
  for (size_t i = 1; i < order.size(); ++i) {
    const VisitKey& a = order[i - 1];
    const VisitKey& b = order[i];
    if (a.key_ordinal == b.key_ordinal && a.cross == b.cross && a.num_holders == b.num_holders &&
        a.neg_size == b.neg_size) {
      bool incomparable = false;
      ComparePieceIds(shards[a.shard].id, shards[b.shard].id, &incomparable);
      if (incomparable) {
        return internal::IncomparableShardsError(shards[a.shard].id, shards[b.shard].id);
      }
    }
  }
  return absl::OkStatus();
}

// Visiting order with duplicate-id and Python TypeError detection. Returns the sort keys in
// visiting order.
absl::StatusOr<std::vector<VisitKey>> VisitingOrder(const DistributionInput& input) {
  const KeyRanks ranks = RankKeys(input.shards);
  CKPT_ASSIGN_OR_RETURN(std::vector<int32_t> by_id, IdOrder(input.shards, ranks));
  std::vector<VisitKey> order = SortByVisit(input, by_id, ranks);
  CKPT_RETURN_IF_ERROR(CheckComparable(input.shards, order));
  return order;
}

// Loads of all ranks plus lazily-invalidated min-heaps of (load, rank), one per large holder
// set. Each heap holds exactly one entry per member rank; an entry is stale when its load is
// below the rank's current load (loads never decrease), and is refreshed when it surfaces.
class LoadTracker {
 public:
  explicit LoadTracker(int64_t num_ranks) : load_(num_ranks, 0) {}

  int64_t load(int32_t rank) const { return load_[rank]; }
  void Add(int32_t rank, int64_t bytes) { load_[rank] += bytes; }

  // Smallest (load, rank) among the valid ranks of `holders` by scanning.
  int32_t ScanMin(absl::Span<const int64_t> holders) const {
    int32_t best = -1;
    const int64_t n = static_cast<int64_t>(load_.size());
    for (int64_t r : holders) {
      if (r < 0 || r >= n) continue;
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

}  // namespace

absl::StatusOr<std::vector<ShardAssignment>> DistributeShardsToRanks(
    const DistributionInput& input) {
  CKPT_RETURN_IF_ERROR(internal::ValidateDistributionInput(input));
  CKPT_ASSIGN_OR_RETURN(std::vector<VisitKey> order, VisitingOrder(input));

  // Group large holder lists by their canonical set (sorted distinct valid ranks): the minimum
  // of (load, rank) depends on nothing else.
  constexpr int32_t kScan = -1;
  std::vector<int32_t> set_of_list(input.holder_lists.size(), kScan);
  std::vector<int64_t> uses_of_list(input.holder_lists.size(), 0);
  for (const DistributablePiece& s : input.shards) ++uses_of_list[s.holder_list];
  std::vector<std::vector<int32_t>> set_members;
  std::vector<int64_t> set_uses;
  absl::flat_hash_map<std::vector<int32_t>, int32_t, VectorHash> set_index;
  for (size_t l = 0; l < input.holder_lists.size(); ++l) {
    const auto& holders = input.holder_lists[l];
    if (uses_of_list[l] == 0 || holders.size() <= kScanThreshold) continue;
    std::vector<int32_t> members;
    members.reserve(holders.size());
    for (int64_t r : holders) {
      if (r >= 0 && r < input.num_ranks) members.push_back(static_cast<int32_t>(r));
    }
    // Lists gathered in rank order are already sorted; only sort the others.
    if (!std::is_sorted(members.begin(), members.end())) std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());
    if (members.size() <= kScanThreshold) continue;
    auto [it, inserted] = set_index.try_emplace(members, static_cast<int32_t>(set_members.size()));
    if (inserted) {
      set_members.push_back(std::move(members));
      set_uses.push_back(0);
    }
    set_of_list[l] = it->second;
    set_uses[it->second] += uses_of_list[l];
  }
  set_index.clear();
  for (size_t l = 0; l < set_of_list.size(); ++l) {
    // A heap pays off only when several shards share the set; otherwise scan the list.
    if (set_of_list[l] != kScan && set_uses[set_of_list[l]] < kMinShardsForHeap) {
      set_of_list[l] = kScan;
    }
  }

  LoadTracker loads(input.num_ranks);
  std::vector<std::vector<LoadTracker::Entry>> heaps(set_members.size());
  std::vector<ShardAssignment> result;
  result.reserve(order.size());
  const size_t n = order.size();
  constexpr size_t kPrefetch = 8;
  for (size_t i = 0; i < n; ++i) {
    // Visiting order jumps around memory: fetch holder lists ahead of use.
    if (i + 2 * kPrefetch < n)
      __builtin_prefetch(&input.holder_lists[order[i + 2 * kPrefetch].holder_list]);
    if (i + kPrefetch < n)
      __builtin_prefetch(input.holder_lists[order[i + kPrefetch].holder_list].data());
    const VisitKey& v = order[i];
    const int32_t set = set_of_list[v.holder_list];
    int32_t rank;
    if (set == kScan) {
      rank = loads.ScanMin(input.holder_lists[v.holder_list]);
    } else {
      auto& heap = heaps[set];
      if (heap.empty()) heap = LoadTracker::MakeHeap(set_members[set], loads);
      rank = loads.HeapMin(heap);
      if (--set_uses[set] == 0) {  // last shard of this set: free its heap
        std::vector<LoadTracker::Entry>().swap(heap);
        std::vector<int32_t>().swap(set_members[set]);
      }
    }
    loads.Add(rank, -v.neg_size);
    result.push_back(ShardAssignment{v.shard, rank});
  }
  return result;
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
