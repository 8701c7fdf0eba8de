#include "planner/save_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/distribute.h"
#include "planner/main_replica.h"
#include "sharding/dtensor.h"
#include "sharding/piece_id.h"

namespace ckpt {
namespace {

PieceId IdOf(const TensorPiece& p) { return PieceId{p.key, p.region.offsets, p.region.flat}; }

// PieceIdLess of two pieces' ids, read in place (no PieceId built per comparison).
bool IdLessInPlace(const std::string& a_key, const Region& a, const std::string& b_key,
                   const Region& b) {
  if (int c = a_key.compare(b_key); c != 0) return c < 0;
  if (a.offsets != b.offsets) {
    return std::lexicographical_compare(a.offsets.begin(), a.offsets.end(), b.offsets.begin(),
                                        b.offsets.end());
  }
  if (a.flat.has_value() != b.flat.has_value()) return !a.flat.has_value();
  if (!a.flat) return false;
  if (a.flat->start != b.flat->start) return a.flat->start < b.flat->start;
  return a.flat->stop < b.flat->stop;
}

// A piece's shard id (key, offsets, flat range) hashed and compared in place, for maps of
// piece indices into the planner's input.
struct PieceIdAtHash {
  absl::Span<const TensorPiece> pieces;
  size_t operator()(int64_t i) const {
    const TensorPiece& p = pieces[i];
    const std::optional<FlatRange>& flat = p.region.flat;
    return absl::HashOf(p.key, absl::MakeConstSpan(p.region.offsets), flat.has_value(),
                        flat ? flat->start : 0, flat ? flat->stop : 0);
  }
};
struct PieceIdAtEq {
  absl::Span<const TensorPiece> pieces;
  bool operator()(int64_t i, int64_t j) const {
    const TensorPiece& a = pieces[i];
    const TensorPiece& b = pieces[j];
    return a.key == b.key && a.region.offsets == b.region.offsets && a.region.flat == b.region.flat;
  }
};

absl::StatusOr<int64_t> PieceBytes(const TensorPiece& p) {
  const int64_t elements = p.region.NumElements();
  const int64_t elem = DTypeSize(p.dtype);
  if (elements > std::numeric_limits<int64_t>::max() / elem) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", p.key, "': piece ", p.DebugString(), " is too large"));
  }
  return elements * elem;
}

// Packs one writer's pieces into files: floor(total / target) files (at least 1, at most one
// per non-empty piece), largest piece first into the file with the fewest bytes (ties: lower
// index).
std::vector<PlannedFile> PackFiles(int64_t rank, std::vector<PlannedPiece> pieces,
                                   int64_t total_bytes, int64_t target_file_bytes) {
  int64_t num_files = std::max<int64_t>(1, total_bytes / std::max<int64_t>(1, target_file_bytes));
  const int64_t nonempty = std::count_if(pieces.begin(), pieces.end(),
                                         [](const PlannedPiece& p) { return p.size_bytes > 0; });
  num_files = std::min<int64_t>(num_files, std::max<int64_t>(1, nonempty));
  auto id_less = [&](int32_t a, int32_t b) {
    if (pieces[a].id_order >= 0 && pieces[b].id_order >= 0) {
      return pieces[a].id_order < pieces[b].id_order;
    }
    return IdLessInPlace(pieces[a].key, pieces[a].region, pieces[b].key, pieces[b].region);
  };
  // Indexes are sorted, not the pieces: moving a piece moves a key, a shape and a region.
  std::vector<int32_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  if (num_files == 1) {  // every piece in one file, in id order: no balancing to do
    if (!std::is_sorted(order.begin(), order.end(), id_less)) {
      std::sort(order.begin(), order.end(), id_less);
    }
    std::vector<PlannedFile> one(1);
    one[0].path = DataFileName(rank, 0);
    one[0].total_bytes = total_bytes;
    one[0].pieces.reserve(order.size());
    for (int32_t p : order) one[0].pieces.push_back(std::move(pieces[p]));
    if (one[0].pieces.empty()) one.clear();
    return one;
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (pieces[a].size_bytes != pieces[b].size_bytes) {
      return pieces[a].size_bytes > pieces[b].size_bytes;
    }
    return id_less(a, b);
  });
  std::vector<PlannedFile> files(num_files);
  std::vector<std::vector<int32_t>> in_file(num_files);
  using Slot = std::pair<int64_t, int64_t>;  // (bytes, file index), min-heap
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> emptiest;
  for (int64_t f = 0; f < num_files; ++f) emptiest.emplace(0, f);
  for (int32_t p : order) {
    auto [bytes, f] = emptiest.top();
    emptiest.pop();
    files[f].total_bytes += pieces[p].size_bytes;
    in_file[f].push_back(p);
    emptiest.emplace(bytes + pieces[p].size_bytes, f);
  }
  for (int64_t f = 0; f < num_files; ++f) {
    std::sort(in_file[f].begin(), in_file[f].end(), id_less);
    files[f].pieces.reserve(in_file[f].size());
    for (int32_t p : in_file[f]) files[f].pieces.push_back(std::move(pieces[p]));
  }
  std::vector<PlannedFile> result;
  for (PlannedFile& file : files) {
    if (file.pieces.empty()) continue;
    file.path = DataFileName(rank, static_cast<int64_t>(result.size()));
    result.push_back(std::move(file));
  }
  return result;
}

// One empty list per rank with room for the rank's pieces (pieces' ranks are in range).
std::vector<std::vector<RankShardInfo>> ReservedPerRank(absl::Span<const TensorPiece> pieces,
                                                        int64_t num_ranks) {
  std::vector<int64_t> count(num_ranks, 0);
  for (const TensorPiece& p : pieces) ++count[p.rank];
  std::vector<std::vector<RankShardInfo>> per_rank(num_ranks);
  for (int64_t r = 0; r < num_ranks; ++r) per_rank[r].reserve(count[r]);
  return per_rank;
}

// The plan's inputs: ranks, file target, groups and the layout itself.
absl::Status ValidateSaveInput(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                               const SavePlanOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateSaveOptions(num_ranks, options));
  for (const TensorPiece& p : pieces) {
    if (p.rank < 0 || p.rank >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", p.key, "': piece ",
                                                     p.DebugString(), " names a rank outside [0, ",
                                                     num_ranks, ")"));
    }
  }
  return ValidateLayout(pieces);
}

// Every piece's size and its shard id's chain: the pieces that share an id, in input order.
struct PiecesById {
  std::vector<int64_t> size_of;         // per piece
  std::vector<int64_t> next_same;       // per piece: the next piece with its id (-1: none)
  std::vector<int64_t> first_of_shard;  // per distinct id, in order of first occurrence
};

// One pass over the pieces with an index of ids read in place (no id copied per piece).
// Refuses two pieces that share an id but not a region, naming both.
absl::StatusOr<PiecesById> ChainPiecesById(absl::Span<const TensorPiece> pieces) {
  PiecesById out;
  out.size_of.resize(pieces.size());
  out.next_same.assign(pieces.size(), -1);
  // First piece of an id -> (its shard, the id's last piece so far).
  absl::flat_hash_map<int64_t, int64_t, PieceIdAtHash, PieceIdAtEq> shard_of_first(
      pieces.size() / 4 + 1, PieceIdAtHash{pieces}, PieceIdAtEq{pieces});
  std::vector<int64_t> last_of_shard;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = pieces[i];
    const int64_t index = static_cast<int64_t>(i);
    auto [it, inserted] =
        shard_of_first.try_emplace(index, static_cast<int64_t>(out.first_of_shard.size()));
    if (inserted) {
      out.first_of_shard.push_back(index);
      last_of_shard.push_back(index);
    } else {
      const TensorPiece& q = pieces[it->first];
      if (q.region != p.region) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", p.key, "': pieces ", q.DebugString(), " and ", p.DebugString(),
                         " share the shard id ", IdOf(p).DebugString(), " but differ in region"));
      }
      out.next_same[last_of_shard[it->second]] = index;
      last_of_shard[it->second] = index;
    }
    CKPT_ASSIGN_OR_RETURN(out.size_of[i], PieceBytes(p));
  }
  return out;
}

// The piece `rank` holds along the chain starting at `first` (its first in input order).
int64_t PieceOfRank(absl::Span<const TensorPiece> pieces, const PiecesById& by_id, int64_t first,
                    int64_t rank) {
  for (int64_t i = first; i >= 0; i = by_id.next_same[i]) {
    if (pieces[i].rank == rank) return i;
  }
  return -1;
}

// Every main replica written by its own holder (one rank: nothing to distribute).
std::vector<std::pair<int64_t, int64_t>> WritesByHolder(absl::Span<const TensorPiece> pieces) {
  std::vector<std::pair<int64_t, int64_t>> writes;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].is_main_replica()) writes.emplace_back(pieces[i].rank, i);
  }
  return writes;
}

// Megatron's save distribution over one group of all `num_ranks` ranks
// (DetermineMainReplicaDistribution in save mode), built from the chains: each id with a main
// replica is one shard whose holders are the ranks of its pieces (repeats kept; their order
// does not matter to the distribution, which compares (load, rank)). Returns (writer, the
// writer's own piece) per shard.
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> WritesOverAllRanks(
    absl::Span<const TensorPiece> pieces, const PiecesById& by_id, int64_t num_ranks) {
  if (num_ranks <= 1) return WritesByHolder(pieces);
  if (num_ranks > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", num_ranks, " ranks is more than the limit of ", kMaxWorldSize, " ranks"));
  }
  DistributionInput input;
  input.num_ranks = num_ranks;
  std::vector<int64_t> first_of_input;  // per distributed shard: its first piece
  for (int64_t first : by_id.first_of_shard) {
    std::vector<int64_t> holders;
    bool has_main = false;
    for (int64_t i = first; i >= 0; i = by_id.next_same[i]) {
      holders.push_back(pieces[i].rank);
      has_main = has_main || pieces[i].is_main_replica();
    }
    if (!has_main) continue;
    input.AddShard(IdOf(pieces[first]), by_id.size_of[first], std::move(holders));
    first_of_input.push_back(first);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<ShardAssignment> assignment, DistributeShardsToRanks(input));
  std::vector<std::pair<int64_t, int64_t>> writes;
  writes.reserve(assignment.size());
  for (const ShardAssignment& a : assignment) {
    writes.emplace_back(a.rank, PieceOfRank(pieces, by_id, first_of_input[a.shard], a.rank));
  }
  return writes;
}

// Megatron's distribution within each process group (MainReplicaWritersPerGroup).
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> WritesPerGroup(
    absl::Span<const TensorPiece> pieces, const PiecesById& by_id, int64_t num_ranks,
    const ProcessGroups& groups) {
  // Per-rank lists in input order, reserved up front so that the ids stay put: the index of
  // first pieces points at them.
  std::vector<std::vector<RankShardInfo>> per_rank = ReservedPerRank(pieces, num_ranks);
  absl::flat_hash_map<const PieceId*, int64_t, PieceIdPtrHash, PieceIdPtrEq> first_piece_of_id;
  first_piece_of_id.reserve(by_id.first_of_shard.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = pieces[i];
    per_rank[p.rank].push_back(RankShardInfo{IdOf(p), by_id.size_of[i], p.is_main_replica()});
    first_piece_of_id.try_emplace(&per_rank[p.rank].back().id, static_cast<int64_t>(i));
  }
  CKPT_ASSIGN_OR_RETURN(auto writers, MainReplicaWritersPerGroup(per_rank, groups));
  std::vector<std::pair<int64_t, int64_t>> writes;
  writes.reserve(writers.size());
  for (const auto& [id, rank] : writers) {
    writes.emplace_back(rank, PieceOfRank(pieces, by_id, first_piece_of_id.at(&id), rank));
  }
  return writes;
}

// Each writer's pieces, in the order of `writes` ((writer, piece index) pairs).
std::vector<std::vector<PlannedPiece>> PiecesByWriter(
    absl::Span<const TensorPiece> pieces, const std::vector<int64_t>& size_of,
    const std::vector<std::pair<int64_t, int64_t>>& writes, int64_t num_ranks) {
  std::vector<std::vector<PlannedPiece>> by_writer(num_ranks);
  for (const auto& [writer, index] : writes) {
    const TensorPiece& p = pieces[index];
    by_writer[writer].push_back(
        PlannedPiece{p.key, p.dtype, p.global_shape, p.region, size_of[index], index});
  }
  return by_writer;
}

}  // namespace

absl::Status ValidateSaveOptions(int64_t num_ranks, const SavePlanOptions& options) {
  if (num_ranks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("save plan needs at least one rank, got ", num_ranks));
  }
  if (options.target_file_bytes <= 0) {
    return absl::InvalidArgumentError("target_file_bytes must be positive");
  }
  if (!options.groups.empty()) {
    CKPT_RETURN_IF_ERROR(ValidateProcessGroups(options.groups, num_ranks));
  }
  return absl::OkStatus();
}

std::string DataFileName(int64_t rank, int64_t index) {
  return absl::StrCat("data/r", rank, "_", index, ".safetensors");
}

SavePlan PackWriters(std::vector<std::vector<PlannedPiece>> by_writer, int64_t num_ranks,
                     int64_t target_file_bytes) {
  SavePlan plan;
  plan.num_ranks = num_ranks;
  for (int64_t rank = 0; rank < num_ranks; ++rank) {
    if (by_writer[rank].empty()) continue;
    WriterPlan w;
    w.rank = rank;
    for (const PlannedPiece& piece : by_writer[rank]) w.total_bytes += piece.size_bytes;
    w.files = PackFiles(rank, std::move(by_writer[rank]), w.total_bytes, target_file_bytes);
    plan.writers.push_back(std::move(w));
  }
  return plan;
}

absl::StatusOr<SavePlan> BuildSavePlan(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                                       const SavePlanOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateSaveInput(pieces, num_ranks, options));
  CKPT_ASSIGN_OR_RETURN(PiecesById by_id, ChainPiecesById(pieces));
  std::vector<std::pair<int64_t, int64_t>> writes;  // (writer, piece index)
  if (!options.groups.empty()) {
    CKPT_ASSIGN_OR_RETURN(writes, WritesPerGroup(pieces, by_id, num_ranks, options.groups));
  } else {
    CKPT_ASSIGN_OR_RETURN(writes, WritesOverAllRanks(pieces, by_id, num_ranks));
  }
  return PackWriters(PiecesByWriter(pieces, by_id.size_of, writes, num_ranks), num_ranks,
                     options.target_file_bytes);
}

}  // namespace ckpt
