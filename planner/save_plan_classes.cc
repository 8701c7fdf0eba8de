#include "planner/save_plan_classes.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "planner/distribute.h"
#include "planner/main_replica.h"
#include "proto/convert.h"
#include "sharding/box_index.h"
#include "sharding/dtensor.h"
#include "sharding/layout.h"
#include "sharding/piece_id.h"

namespace ckpt {
namespace {

// A shard id without its flat range: (key, offsets, whether it has one), read in place.
struct CanonKey {
  absl::string_view key;
  absl::Span<const int64_t> offsets;
  bool has_flat = false;
  template <typename H>
  friend H AbslHashValue(H h, const CanonKey& k) {
    return H::combine(std::move(h), k.key, k.offsets, k.has_flat);
  }
  friend bool operator==(const CanonKey& a, const CanonKey& b) {
    return a.key == b.key && a.has_flat == b.has_flat &&
           std::equal(a.offsets.begin(), a.offsets.end(), b.offsets.begin(), b.offsets.end());
  }
};

// One distinct shared list, converted once: each piece as a TensorPiece template (no rank,
// replica id or flat range), its canonical id and key, and the ranks holding the list.
struct ListInfo {
  const RankPieces* first_holder = nullptr;  // a rank's pieces with this list (for conversion)
  std::vector<TensorPiece> pieces;
  std::vector<int32_t> canon;    // per piece: CanonKey index
  std::vector<int32_t> key_of;   // per piece: key index
  int bad = -1;                  // first piece whose dtype or box does not convert (-1: none)
  std::vector<int64_t> holders;  // ranks with this list, ascending
};

// Every rank's list converted, plus the indexes the passes below share.
struct Classes {
  std::vector<ListInfo> lists;
  std::vector<int32_t> list_of_rank;  // -1: the rank holds nothing
  std::vector<int64_t> ref_begin;     // per rank: its first reference (prefix sums), + total
  std::vector<const RankPieces*> ranks;
  absl::flat_hash_map<CanonKey, int32_t> canon;
  absl::flat_hash_map<absl::string_view, int32_t> key_index;
  std::vector<absl::string_view> keys;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> key_pieces;  // per key: (list, piece)
};

// Rank r's piece i, built from its list's template (valid templates only).
void FillPiece(const Classes& c, int64_t r, int i, TensorPiece* out) {
  const ListInfo& list = c.lists[c.list_of_rank[r]];
  const RankPieces& own = *c.ranks[r];
  const TensorPiece& t = list.pieces[i];
  out->key = t.key;
  out->rank = r;
  out->dtype = t.dtype;
  out->global_shape = t.global_shape;
  out->region.offsets = t.region.offsets;
  out->region.lengths = t.region.lengths;
  out->region.flat.reset();
  if (own.has_flat(i)) out->region.flat = FlatRange{own.flat_start(i), own.flat_stop(i)};
  absl::Span<const int64_t> replica = own.replica_id(i);
  out->replica_id.assign(replica.begin(), replica.end());
}

// Converts `list` (first held by `pieces`) into templates and indexes its pieces.
void ConvertList(const RankPieces& pieces, Classes* c, ListInfo* list) {
  list->first_holder = &pieces;
  const int n = pieces.size();
  list->pieces.resize(n);
  list->canon.assign(n, -1);
  list->key_of.assign(n, -1);
  const int32_t list_index = static_cast<int32_t>(c->lists.size()) - 1;
  for (int i = 0; i < n; ++i) {
    const pb::PieceMeta& s = pieces.shared(i);
    absl::StatusOr<DType> dtype = DTypeFromProto(s.tensor().dtype());
    absl::StatusOr<Region> region = RegionFromProto(s.region());
    if (!dtype.ok() || !region.ok()) {
      list->bad = i;
      return;
    }
    TensorPiece& t = list->pieces[i];
    t.key = s.tensor().key();
    t.dtype = *dtype;
    t.global_shape.assign(s.tensor().global_shape().begin(), s.tensor().global_shape().end());
    t.region = *std::move(region);
    t.region.flat.reset();
  }
  for (int i = 0; i < n; ++i) {
    const TensorPiece& t = list->pieces[i];
    const int32_t next_canon = static_cast<int32_t>(c->canon.size());
    list->canon[i] =
        c->canon.try_emplace(CanonKey{t.key, t.region.offsets, pieces.has_flat(i)}, next_canon)
            .first->second;
    auto [it, inserted] = c->key_index.try_emplace(t.key, static_cast<int32_t>(c->keys.size()));
    if (inserted) {
      c->keys.push_back(t.key);
      c->key_pieces.emplace_back();
    }
    list->key_of[i] = it->second;
    c->key_pieces[it->second].emplace_back(list_index, i);
  }
}

// The first piece of `pieces` (rank r) that does not convert, as GatheredPieces reported it.
absl::Status FirstConversionError(const RankPieces& pieces, int64_t r, int bad) {
  const int end = bad >= 0 ? bad + 1 : pieces.size();
  for (int i = 0; i < end; ++i) {
    if (i != bad && (!pieces.has_flat(i) ||
                     (pieces.flat_start(i) >= 0 && pieces.flat_start(i) <= pieces.flat_stop(i)))) {
      continue;
    }
    absl::StatusOr<TensorPiece> p = TensorPieceOf(pieces, r, i);
    if (!p.ok()) return p.status();
  }
  return absl::OkStatus();
}

// Groups the ranks by list, converting each list once. Conversion errors as GatheredPieces'.
absl::StatusOr<Classes> ClassesOf(absl::Span<const RankPieces* const> ranks) {
  Classes c;
  c.ranks.assign(ranks.begin(), ranks.end());
  c.list_of_rank.assign(ranks.size(), -1);
  c.ref_begin.assign(ranks.size() + 1, 0);
  absl::flat_hash_map<const SharedPieceList*, int32_t> index;
  for (size_t r = 0; r < ranks.size(); ++r) {
    c.ref_begin[r + 1] = c.ref_begin[r];
    if (ranks[r] == nullptr || ranks[r]->empty()) continue;
    c.ref_begin[r + 1] += ranks[r]->size();
    auto [it, inserted] = index.try_emplace(ranks[r]->list(), static_cast<int32_t>(c.lists.size()));
    if (inserted) {
      c.lists.emplace_back();
      ConvertList(*ranks[r], &c, &c.lists.back());
    }
    ListInfo& list = c.lists[it->second];
    CKPT_RETURN_IF_ERROR(FirstConversionError(*ranks[r], static_cast<int64_t>(r), list.bad));
    c.list_of_rank[r] = it->second;
    list.holders.push_back(static_cast<int64_t>(r));
  }
  return c;
}

// The main boxes of one tensor as TensorIsPlainlyValid collects them: each distinct box once
// (a box whose flat pieces tile it exactly counts as the whole box).
struct PlainMainBoxes {
  std::vector<Region> boxes;
  int64_t elements = 0;
  struct FlatBox {
    const Region* box = nullptr;                     // its first template's (flat reset)
    std::vector<std::pair<int64_t, int64_t>> mains;  // the main flat ranges in it
  };
  absl::flat_hash_map<int32_t, FlatBox> flat_by_canon;
};

// Whether every template of tensor `k` agrees with `ref` in dtype and shape and has a valid
// box; collects the main boxes of its non-flat pieces (each list piece main on at most one of
// its holders) and the main flat ranges by box. False on anything else.
bool PlainTemplatesAndMains(const Classes& c, int32_t k, const TensorPiece& ref,
                            PlainMainBoxes* out) {
  for (const auto& [l, i] : c.key_pieces[k]) {
    const ListInfo& list = c.lists[l];
    const TensorPiece& t = list.pieces[i];
    if (t.dtype != ref.dtype || t.global_shape != ref.global_shape ||
        !ValidateRegion(t.region, ref.global_shape).ok()) {
      return false;
    }
    const int64_t box = t.region.BoxElements();
    PlainMainBoxes::FlatBox* flat = nullptr;
    if (c.ranks[list.holders[0]]->has_flat(i)) {
      flat = &out->flat_by_canon[list.canon[i]];
      if (flat->box == nullptr) flat->box = &t.region;
      if (flat->box->lengths != t.region.lengths) return false;  // one id, two boxes
    }
    int mains = 0;
    for (int64_t r : list.holders) {
      const RankPieces& own = *c.ranks[r];
      if (flat != nullptr) {
        if (own.flat_start(i) < 0 || own.flat_start(i) > own.flat_stop(i) ||
            own.flat_stop(i) > box) {
          return false;
        }
        if (own.is_main_replica(i) && own.flat_start(i) < own.flat_stop(i)) {
          flat->mains.emplace_back(own.flat_start(i), own.flat_stop(i));
        }
      } else if (own.is_main_replica(i)) {
        ++mains;
      }
    }
    if (mains > 1) return false;
    if (mains == 1 && box > 0) {
      out->boxes.push_back(t.region);
      out->elements += box;
    }
  }
  return true;
}

// A fast path of CheckTensorLayout for tensor `k` over the classes: true when the tensor is
// certainly valid (every template agrees in dtype and shape and has a valid region, every flat
// range is inside its box, and the main replicas tile the tensor exactly: each box's main flat
// ranges tile the box, and the distinct main boxes are disjoint and add up to the tensor), with
// work per reference but a TensorPiece and box per distinct box only. False sends the tensor
// to the exact check, which words whatever is wrong (or finds it valid after all).
bool TensorIsPlainlyValid(const Classes& c, int32_t k) {
  const auto& [first_list, first_piece] = c.key_pieces[k][0];
  const TensorPiece& ref = c.lists[first_list].pieces[first_piece];
  PlainMainBoxes main;
  if (!PlainTemplatesAndMains(c, k, ref, &main)) return false;
  for (auto& [canon, flat] : main.flat_by_canon) {
    if (flat.mains.empty()) continue;
    std::sort(flat.mains.begin(), flat.mains.end());
    int64_t at = 0;
    for (const auto& [start, stop] : flat.mains) {
      if (start != at) return false;  // a hole or an overlap in the box
      at = stop;
    }
    if (at != flat.box->BoxElements()) return false;
    main.boxes.push_back(*flat.box);
    main.elements += at;
  }
  absl::StatusOr<int64_t> total = CheckedNumElements(ref.global_shape);
  if (!total.ok() || main.elements != *total) return false;
  bool overlap = false;
  ForEachSelfIntersectingPair(main.boxes, [&](int64_t, int64_t) {
    overlap = true;
    return false;
  });
  return !overlap;
}

// ValidateLayout over every reference, one tensor at a time (the same checks, order and
// messages; a tensor's pieces are built for its check and reused for the next).
absl::Status ValidateClasses(const Classes& c, int max_issues = 16) {
  std::vector<int32_t> order(c.keys.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int32_t>(k);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return c.keys[a] < c.keys[b]; });
  std::vector<std::string> messages;
  std::vector<std::pair<int64_t, int32_t>> refs;  // (rank, piece), in input order
  std::vector<TensorPiece> pieces;
  for (int32_t k : order) {
    const int left = max_issues - static_cast<int>(messages.size());
    if (left <= 0) break;
    if (TensorIsPlainlyValid(c, k)) continue;
    refs.clear();
    for (const auto& [list, i] : c.key_pieces[k]) {
      for (int64_t r : c.lists[list].holders) refs.emplace_back(r, i);
    }
    std::sort(refs.begin(), refs.end());
    if (pieces.size() < refs.size()) pieces.resize(refs.size());
    for (size_t j = 0; j < refs.size(); ++j)
      FillPiece(c, refs[j].first, refs[j].second, &pieces[j]);
    for (LayoutIssue& issue :
         CheckTensorLayout(absl::MakeConstSpan(pieces.data(), refs.size()), left)) {
      messages.push_back(std::move(issue.message));
    }
  }
  return LayoutIssuesStatus(messages, max_issues);
}

// One distinct shard id: its first reference, size, whether any holder has it as the main
// replica, and its holders (rank, piece) in input order (holder_begin indexes Chains::holders).
struct ShardInfo {
  int64_t first_rank = 0;
  int32_t first_piece = 0;
  bool has_main = false;
  int64_t size = 0;
  int64_t holder_begin = 0;
  int64_t holder_count = 0;
};

// The references chained by shard id (ChainPiecesById over the references).
struct Chains {
  std::vector<ShardInfo> shards;                     // in order of first occurrence
  std::vector<int32_t> shard_of_ref;                 // per reference
  std::vector<std::pair<int32_t, int32_t>> holders;  // (rank, piece) per reference, by shard
};

// The bytes of rank r's piece i, read from its list's template and its own flat range (no
// TensorPiece is built unless the size overflows, for the error).
absl::StatusOr<int64_t> PieceSize(const Classes& c, int64_t r, int i) {
  const RankPieces& own = *c.ranks[r];
  const TensorPiece& t = c.lists[c.list_of_rank[r]].pieces[i];
  const int64_t elements =
      own.has_flat(i) ? own.flat_stop(i) - own.flat_start(i) : t.region.BoxElements();
  const int64_t elem = DTypeSize(t.dtype);
  if (elements > std::numeric_limits<int64_t>::max() / elem) {
    TensorPiece p;
    FillPiece(c, r, i, &p);
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", p.key, "': piece ", p.DebugString(), " is too large"));
  }
  return elements * elem;
}

// The error of two references with one shard id but different regions.
absl::Status RegionConflict(const Classes& c, const ShardInfo& shard, int64_t r, int i) {
  TensorPiece q, p;
  FillPiece(c, shard.first_rank, shard.first_piece, &q);
  FillPiece(c, r, i, &p);
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", p.key, "': pieces ", q.DebugString(), " and ", p.DebugString(),
      " share the shard id ", PieceId{p.key, p.region.offsets, p.region.flat}.DebugString(),
      " but differ in region"));
}

// The flat shards of one canonical box, by their range. Ranges usually arrive in increasing
// order (ZeRO: the ranks holding a box in data-parallel order), so a range past the greatest
// so far is new without a lookup, and the box's tail is all that is touched (a hash index of
// every range was a cache miss per reference). Until then only each shard's number is kept
// (4 bytes per range, not 24: at 100k ranks the kept ranges were most of the chaining's
// fresh memory); an index is built from the shards' own ranges the first time a range
// arrives out of order.
class FlatShardsOfBox {
 public:
  // The slot (shard, or -1 when new) of [start, stop); valid until the next call.
  // `range_of(shard)` is a kept shard's range (asked only when the index is built).
  template <typename RangeOf>
  int32_t* Slot(int64_t start, int64_t stop, const RangeOf& range_of) {
    if (index_.empty() && std::make_pair(start, stop) > last_) {
      last_ = {start, stop};
      seen_.push_back(-1);
      return &seen_.back();
    }
    if (index_.empty()) {
      index_.reserve(seen_.size() + 1);
      for (int32_t shard : seen_) index_.emplace(range_of(shard), shard);
      std::vector<int32_t>().swap(seen_);
    }
    return &index_.try_emplace(std::make_pair(start, stop), -1).first->second;
  }

 private:
  std::pair<int64_t, int64_t> last_{-1, -1};
  std::vector<int32_t> seen_;  // shards in arrival order (increasing ranges), until index_
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int32_t> index_;
};

// Finds (or adds) the shard of rank r's piece i.
absl::StatusOr<int32_t> ShardOf(const Classes& c, int64_t r, int i, std::vector<int32_t>* by_canon,
                                std::vector<FlatShardsOfBox>* by_flat, Chains* out) {
  const ListInfo& list = c.lists[c.list_of_rank[r]];
  const RankPieces& own = *c.ranks[r];
  const int32_t canon = list.canon[i];
  const int32_t next = static_cast<int32_t>(out->shards.size());
  int32_t* slot;
  if (own.has_flat(i)) {
    slot = (*by_flat)[canon].Slot(own.flat_start(i), own.flat_stop(i), [&](int32_t s) {
      const ShardInfo& shard = out->shards[s];
      const RankPieces& first = *c.ranks[shard.first_rank];
      return std::make_pair(first.flat_start(shard.first_piece),
                            first.flat_stop(shard.first_piece));
    });
  } else {
    slot = &(*by_canon)[canon];
  }
  if (*slot < 0) {
    *slot = next;
    CKPT_ASSIGN_OR_RETURN(int64_t size, PieceSize(c, r, i));
    out->shards.push_back(ShardInfo{r, i, false, size, 0, 0});
  } else {
    const ShardInfo& shard = out->shards[*slot];
    const int32_t first_list = c.list_of_rank[shard.first_rank];
    // A replica from the same list and place has the same template: nothing to compare.
    if ((first_list != c.list_of_rank[r] || shard.first_piece != i) &&
        c.lists[first_list].pieces[shard.first_piece].region.lengths !=
            list.pieces[i].region.lengths) {
      return RegionConflict(c, shard, r, i);
    }
  }
  return *slot;
}

// Chains every reference by shard id, in (rank, piece) order.
absl::StatusOr<Chains> ChainReferences(const Classes& c) {
  Chains out;
  std::vector<int32_t> by_canon(c.canon.size(), -1);
  std::vector<FlatShardsOfBox> by_flat(c.canon.size());
  out.shard_of_ref.reserve(c.ref_begin.back());
  // At most one shard per reference: reserved once, never copied as it grows (with flat
  // ranges nearly every reference is a shard of its own: ~20M at 100k ranks).
  out.shards.reserve(c.ref_begin.back());
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    if (c.list_of_rank[r] < 0) continue;
    const RankPieces& own = *c.ranks[r];
    for (int i = 0; i < own.size(); ++i) {
      CKPT_ASSIGN_OR_RETURN(int32_t s,
                            ShardOf(c, static_cast<int64_t>(r), i, &by_canon, &by_flat, &out));
      out.shard_of_ref.push_back(s);
      ShardInfo& shard = out.shards[s];
      shard.has_main = shard.has_main || own.is_main_replica(i);
      ++shard.holder_count;
    }
  }
  int64_t at = 0;
  for (ShardInfo& shard : out.shards) {
    shard.holder_begin = at;
    at += shard.holder_count;
    shard.holder_count = 0;
  }
  out.holders.resize(at);
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    for (int64_t ref = c.ref_begin[r]; ref < c.ref_begin[r + 1]; ++ref) {
      ShardInfo& shard = out.shards[out.shard_of_ref[ref]];
      out.holders[shard.holder_begin + shard.holder_count++] = {
          static_cast<int32_t>(r), static_cast<int32_t>(ref - c.ref_begin[r])};
    }
  }
  return out;
}

// The piece of `rank` along shard s's holders (its first in input order; -1: none).
int32_t PieceOfRank(const Chains& chains, int32_t s, int64_t rank) {
  const ShardInfo& shard = chains.shards[s];
  for (int64_t h = shard.holder_begin; h < shard.holder_begin + shard.holder_count; ++h) {
    if (chains.holders[h].first == rank) return chains.holders[h].second;
  }
  return -1;
}

PieceId IdOfShard(const Classes& c, const ShardInfo& shard) {
  TensorPiece p;
  FillPiece(c, shard.first_rank, shard.first_piece, &p);
  return PieceId{std::move(p.key), std::move(p.region.offsets), p.region.flat};
}

using Writes = std::vector<std::pair<int64_t, int32_t>>;  // (writer, the writer's own piece)

// Appends shard `shard` (with holder list `holder_list`) to `input`, its key and offsets read
// from its first reference's template in place.
void AddCompactShard(const Classes& c, const ShardInfo& shard, int32_t holder_list,
                     CompactDistributionInput* input) {
  const ListInfo& list = c.lists[c.list_of_rank[shard.first_rank]];
  const std::vector<int64_t>& offsets = list.pieces[shard.first_piece].region.offsets;
  CompactDistributionInput::Shard out;
  out.size_bytes = shard.size;
  out.offsets_start = static_cast<int64_t>(input->offsets.size());
  out.num_offsets = static_cast<int32_t>(offsets.size());
  input->offsets.insert(input->offsets.end(), offsets.begin(), offsets.end());
  out.key = list.key_of[shard.first_piece];
  out.holder_list = holder_list;
  const RankPieces& own = *c.ranks[shard.first_rank];
  if (own.has_flat(shard.first_piece)) {
    out.flat = static_cast<int32_t>(input->flats.size());
    input->flats.push_back(
        FlatRange{own.flat_start(shard.first_piece), own.flat_stop(shard.first_piece)});
  }
  input->shards.push_back(out);
}

// Whether WritesOverAllRanks may give every shard of one holder (with a main replica) to that
// holder before distributing the others (CompactDistributionInput::initial_bytes): such shards
// come first in Megatron's visiting order and only their bytes bear on the rest, so the
// assignment is the same, without sorting them (~12 M of 12.3 M shards at 100k GPT ranks
// with a distributed optimizer). Not when the sum of the distributed shards' sizes passes
// int64, nor when some (key, offsets) has shards both with and without a flat range (Python's
// sort may fail on such a pair: DistributeShardsToRanks names it), so that those errors stay
// the distributor's own.
bool SingleHolderShardsMayBeGivenFirst(const Classes& c, const Chains& chains) {
  absl::flat_hash_map<std::pair<absl::string_view, absl::Span<const int64_t>>, bool> flat_of_box;
  for (const auto& [canon, index] : c.canon) {
    auto [it, inserted] = flat_of_box.try_emplace({canon.key, canon.offsets}, canon.has_flat);
    if (!inserted && it->second != canon.has_flat) return false;
  }
  int64_t total = 0;
  for (const ShardInfo& shard : chains.shards) {
    if (!shard.has_main) continue;
    if (shard.size > std::numeric_limits<int64_t>::max() - total) return false;
    total += shard.size;
  }
  return true;
}

// Megatron's save distribution over all ranks (BuildSavePlan's WritesOverAllRanks): shards
// with a main replica in order of first occurrence, holders in input order; holder lists
// equal between shards are given once. Built in the distributor's compact form (keys interned,
// offsets, flat ranges and holders in shared arrays): nothing is allocated per shard.
absl::StatusOr<Writes> WritesOverAllRanks(const Classes& c, const Chains& chains,
                                          int64_t num_ranks) {
  Writes writes;
  if (num_ranks <= 1) {
    for (size_t r = 0; r < c.ranks.size(); ++r) {
      if (c.list_of_rank[r] < 0) continue;
      for (int i = 0; i < c.ranks[r]->size(); ++i) {
        if (c.ranks[r]->is_main_replica(i)) writes.emplace_back(static_cast<int64_t>(r), i);
      }
    }
    return writes;
  }
  if (num_ranks > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", num_ranks, " ranks is more than the limit of ", kMaxWorldSize, " ranks"));
  }
  CompactDistributionInput input;
  input.num_ranks = num_ranks;
  for (absl::string_view key : c.keys) input.keys.emplace_back(key.data(), key.size());
  input.shards.reserve(chains.shards.size());
  absl::flat_hash_map<std::vector<int32_t>, int32_t> list_of_holders;
  // Lists of one holder (a ZeRO rank's own flat ranges: most shards) by rank, not hashed.
  std::vector<int32_t> list_of_single(num_ranks, -1);
  std::vector<int32_t> shard_of_input;
  std::vector<int32_t> holders;
  const bool give_single_holders = SingleHolderShardsMayBeGivenFirst(c, chains);
  if (give_single_holders) input.initial_bytes.assign(num_ranks, 0);
  for (size_t s = 0; s < chains.shards.size(); ++s) {
    const ShardInfo& shard = chains.shards[s];
    if (!shard.has_main) continue;
    if (give_single_holders && shard.holder_count == 1) {
      const auto& [rank, piece] = chains.holders[shard.holder_begin];
      writes.emplace_back(rank, piece);
      input.initial_bytes[rank] += shard.size;
      continue;
    }
    holders.clear();
    for (int64_t h = 0; h < shard.holder_count; ++h) {
      holders.push_back(chains.holders[shard.holder_begin + h].first);
    }
    const int32_t lists = static_cast<int32_t>(input.list_start.size()) - 1;
    int32_t* list = holders.size() == 1 ? &list_of_single[holders[0]]
                                        : &list_of_holders.try_emplace(holders, -1).first->second;
    if (*list < 0) {
      *list = lists;
      input.holders.insert(input.holders.end(), holders.begin(), holders.end());
      input.list_start.push_back(static_cast<int64_t>(input.holders.size()));
    }
    AddCompactShard(c, shard, *list, &input);
    shard_of_input.push_back(static_cast<int32_t>(s));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<ShardAssignment> assignment, DistributeShardsToRanks(input));
  writes.reserve(writes.size() + assignment.size());
  for (const ShardAssignment& a : assignment) {
    writes.emplace_back(a.rank, PieceOfRank(chains, shard_of_input[a.shard], a.rank));
  }
  return writes;
}

// One process group's writes (MainReplicaWritersPerGroup for that group).
absl::Status WritesOfGroup(const Classes& c, const Chains& chains, std::vector<int64_t> ranks,
                           Writes* writes) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::vector<RankShardInfo>> lists(ranks.size());
  absl::flat_hash_map<const PieceId*, int32_t, PieceIdPtrHash, PieceIdPtrEq> shard_of_id;
  for (size_t g = 0; g < ranks.size(); ++g) {
    const int64_t r = ranks[g];
    if (r >= static_cast<int64_t>(c.ranks.size()) || c.list_of_rank[r] < 0) continue;
    lists[g].reserve(c.ranks[r]->size());
    for (int i = 0; i < c.ranks[r]->size(); ++i) {
      const int32_t s = chains.shard_of_ref[c.ref_begin[r] + i];
      lists[g].push_back(RankShardInfo{IdOfShard(c, chains.shards[s]), chains.shards[s].size,
                                       c.ranks[r]->is_main_replica(i)});
    }
    for (size_t i = 0; i < lists[g].size(); ++i) {
      shard_of_id.try_emplace(&lists[g][i].id, chains.shard_of_ref[c.ref_begin[r] + i]);
    }
  }
  absl::StatusOr<std::optional<MainReplicaDistribution>> d =
      DetermineMainReplicaDistribution(lists, static_cast<int64_t>(ranks.size()), false);
  if (!d.ok()) {
    return absl::Status(d.status().code(),
                        absl::StrCat("process group of ranks [", absl::StrJoin(ranks, ","),
                                     "]: ", d.status().message()));
  }
  if (!d->has_value()) {  // one rank: it writes its own main replicas
    for (size_t i = 0; i < lists[0].size(); ++i) {
      if (!lists[0][i].is_main) continue;
      writes->emplace_back(ranks[0],
                           PieceOfRank(chains, shard_of_id.at(&lists[0][i].id), ranks[0]));
    }
    return absl::OkStatus();
  }
  for (const auto& [id, group_rank] : (*d)->main_rank_for_shard) {
    const int64_t writer = ranks[group_rank];
    writes->emplace_back(writer, PieceOfRank(chains, shard_of_id.at(&id), writer));
  }
  return absl::OkStatus();
}

// Per list, each template's place in id order (key, offsets, then pieces without a flat range
// first), so that a writer's pieces are put in id order comparing integers, not keys. Templates
// that tie (two flat ranges of one box) share a place: their flat ranges order them.
std::vector<std::vector<int32_t>> TemplateIdOrder(const Classes& c) {
  std::vector<std::vector<int32_t>> place(c.lists.size());
  std::vector<int32_t> order;
  for (size_t l = 0; l < c.lists.size(); ++l) {
    const ListInfo& list = c.lists[l];
    const RankPieces& first = *list.first_holder;
    order.resize(list.pieces.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    auto less = [&](int32_t a, int32_t b) {
      const TensorPiece& x = list.pieces[a];
      const TensorPiece& y = list.pieces[b];
      if (int k = x.key.compare(y.key); k != 0) return k < 0;
      if (x.region.offsets != y.region.offsets) return x.region.offsets < y.region.offsets;
      return !first.has_flat(a) && first.has_flat(b);
    };
    std::sort(order.begin(), order.end(), less);
    place[l].resize(order.size());
    int32_t at = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k > 0 && less(order[k - 1], order[k])) at = static_cast<int32_t>(k);
      place[l][order[k]] = at;
    }
  }
  return place;
}

// Each writer's pieces (BuildSavePlan's PiecesByWriter), in id order (nearly: see below), so
// that PackFiles finds them sorted and does not sort again.
std::vector<std::vector<PlannedPiece>> PiecesByWriter(const Classes& c, const Chains& chains,
                                                      const Writes& writes, int64_t num_ranks,
                                                      bool describe_pieces) {
  std::vector<int64_t> begin(num_ranks + 1, 0);
  for (const auto& [writer, i] : writes) ++begin[writer + 1];
  for (int64_t r = 0; r < num_ranks; ++r) begin[r + 1] += begin[r];
  std::vector<int32_t> pieces(writes.size());  // each writer's piece indices, by writer
  {
    std::vector<int64_t> next(begin.begin(), begin.end() - 1);
    for (const auto& [writer, i] : writes) pieces[next[writer]++] = i;
  }
  const std::vector<std::vector<int32_t>> place = TemplateIdOrder(c);
  std::vector<std::vector<PlannedPiece>> by_writer(num_ranks);
  for (int64_t writer = 0; writer < num_ranks; ++writer) {
    if (begin[writer] == begin[writer + 1]) continue;
    const RankPieces& own = *c.ranks[writer];
    const ListInfo& list = c.lists[c.list_of_rank[writer]];
    const std::vector<int32_t>& rank_of = place[c.list_of_rank[writer]];
    const auto first = pieces.begin() + begin[writer], last = pieces.begin() + begin[writer + 1];
    // Exactly id order: a place, then (two flat ranges of one box) the flat range. A writer
    // writes each shard id once, so no two of its pieces tie.
    std::sort(first, last, [&](int32_t a, int32_t b) {
      if (rank_of[a] != rank_of[b]) return rank_of[a] < rank_of[b];
      if (!own.has_flat(a) || !own.has_flat(b)) return false;  // one place: both or neither
      return std::make_pair(own.flat_start(a), own.flat_stop(a)) <
             std::make_pair(own.flat_start(b), own.flat_stop(b));
    });
    by_writer[writer].reserve(last - first);
    for (auto it = first; it != last; ++it) {
      const int32_t i = *it;
      PlannedPiece& p = by_writer[writer].emplace_back();
      p.size_bytes = chains.shards[chains.shard_of_ref[c.ref_begin[writer] + i]].size;
      p.source_index = i;
      p.id_order = it - first;
      if (!describe_pieces) continue;
      // Built from the list's template in place (FillPiece without the rank and replica id).
      const TensorPiece& t = list.pieces[i];
      p.key = t.key;
      p.dtype = t.dtype;
      p.global_shape = t.global_shape;
      p.region.offsets = t.region.offsets;
      p.region.lengths = t.region.lengths;
      if (own.has_flat(i)) p.region.flat = FlatRange{own.flat_start(i), own.flat_stop(i)};
    }
  }
  return by_writer;
}

// BuildSavePlan's ValidateSaveInput, on the classes.
absl::Status ValidateInput(const Classes& c, int64_t num_ranks, const SavePlanOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateSaveOptions(num_ranks, options));
  for (int64_t r = num_ranks; r < static_cast<int64_t>(c.ranks.size()); ++r) {
    if (c.list_of_rank[r] < 0) continue;
    TensorPiece p;
    FillPiece(c, r, 0, &p);
    return absl::InvalidArgumentError(absl::StrCat("tensor '", p.key, "': piece ", p.DebugString(),
                                                   " names a rank outside [0, ", num_ranks, ")"));
  }
  return ValidateClasses(c);
}

}  // namespace

absl::StatusOr<TensorPiece> TensorPieceOf(const RankPieces& pieces, int64_t rank, int i) {
  const pb::PieceMeta s = pieces.Piece(i);
  TensorPiece p;
  p.key = s.tensor().key();
  p.rank = rank;
  absl::StatusOr<DType> dtype = DTypeFromProto(s.tensor().dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " tensor ", p.key, ": ", dtype.status().message()));
  }
  p.dtype = *dtype;
  p.global_shape.assign(s.tensor().global_shape().begin(), s.tensor().global_shape().end());
  absl::StatusOr<Region> region = RegionFromProto(s.region());
  if (!region.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " tensor ", p.key, ": ", region.status().message()));
  }
  p.region = *std::move(region);
  p.replica_id.assign(s.replica_id().begin(), s.replica_id().end());
  return p;
}

absl::StatusOr<SavePlan> BuildSavePlanFromClasses(absl::Span<const RankPieces* const> ranks,
                                                  int64_t num_ranks,
                                                  const SavePlanOptions& options) {
  CKPT_ASSIGN_OR_RETURN(Classes classes, ClassesOf(ranks));
  CKPT_RETURN_IF_ERROR(ValidateInput(classes, num_ranks, options));
  CKPT_ASSIGN_OR_RETURN(Chains chains, ChainReferences(classes));
  Writes writes;
  if (!options.groups.empty()) {
    for (const std::vector<int64_t>& group : options.groups) {
      CKPT_RETURN_IF_ERROR(WritesOfGroup(classes, chains, group, &writes));
    }
  } else {
    CKPT_ASSIGN_OR_RETURN(writes, WritesOverAllRanks(classes, chains, num_ranks));
  }
  return PackWriters(PiecesByWriter(classes, chains, writes, num_ranks, options.describe_pieces),
                     num_ranks, options.target_file_bytes);
}

}  // namespace ckpt
