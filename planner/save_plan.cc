#include "planner/save_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/main_replica.h"
#include "sharding/piece_id.h"

namespace ckpt {
namespace {

PieceId IdOf(const TensorPiece& p) { return PieceId{p.key, p.region.offsets, p.region.flat}; }

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
  auto id_less = [](const PlannedPiece& a, const PlannedPiece& b) {
    return PieceIdLess()(PieceId{a.key, a.region.offsets, a.region.flat},
                         PieceId{b.key, b.region.offsets, b.region.flat});
  };
  std::stable_sort(pieces.begin(), pieces.end(), [&](const PlannedPiece& a, const PlannedPiece& b) {
    if (a.size_bytes != b.size_bytes) return a.size_bytes > b.size_bytes;
    return id_less(a, b);
  });
  std::vector<PlannedFile> files(num_files);
  using Slot = std::pair<int64_t, int64_t>;  // (bytes, file index), min-heap
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> emptiest;
  for (int64_t f = 0; f < num_files; ++f) emptiest.emplace(0, f);
  for (PlannedPiece& p : pieces) {
    auto [bytes, f] = emptiest.top();
    emptiest.pop();
    files[f].total_bytes += p.size_bytes;
    files[f].pieces.push_back(std::move(p));
    emptiest.emplace(bytes + files[f].pieces.back().size_bytes, f);
  }
  std::vector<PlannedFile> result;
  for (PlannedFile& file : files) {
    if (file.pieces.empty()) continue;
    std::sort(file.pieces.begin(), file.pieces.end(), id_less);
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
  for (const TensorPiece& p : pieces) {
    if (p.rank < 0 || p.rank >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", p.key, "': piece ",
                                                     p.DebugString(), " names a rank outside [0, ",
                                                     num_ranks, ")"));
    }
  }
  return ValidateLayout(pieces);
}

}  // namespace

std::string DataFileName(int64_t rank, int64_t index) {
  return absl::StrCat("data/r", rank, "_", index, ".safetensors");
}

absl::StatusOr<SavePlan> BuildSavePlan(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                                       const SavePlanOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateSaveInput(pieces, num_ranks, options));

  // Per-rank lists in input order, the piece index of each (id, rank), and one region per id.
  // Reserved up front so that the ids in per_rank stay put: first_piece_of_id points at them
  // instead of holding a second copy of every piece's id.
  std::vector<std::vector<RankShardInfo>> per_rank = ReservedPerRank(pieces, num_ranks);
  absl::flat_hash_map<const PieceId*, int64_t, PieceIdPtrHash, PieceIdPtrEq> first_piece_of_id;
  first_piece_of_id.reserve(pieces.size());
  // (first piece index of the id, rank) -> the rank's own piece with that id.
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> piece_of_id_rank;
  std::vector<int64_t> size_of(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = pieces[i];
    per_rank[p.rank].push_back(RankShardInfo{IdOf(p), 0, p.is_main_replica()});
    const PieceId& id = per_rank[p.rank].back().id;
    auto [first, inserted] = first_piece_of_id.try_emplace(&id, static_cast<int64_t>(i));
    if (!inserted && pieces[first->second].region != p.region) {
      const TensorPiece& q = pieces[first->second];
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", p.key, "': pieces ", q.DebugString(), " and ", p.DebugString(),
                       " share the shard id ", id.DebugString(), " but differ in region"));
    }
    CKPT_ASSIGN_OR_RETURN(size_of[i], PieceBytes(p));
    per_rank[p.rank].back().size_bytes = size_of[i];
    piece_of_id_rank.try_emplace(std::make_pair(first->second, p.rank), static_cast<int64_t>(i));
  }

  // Writer of every main replica: the distribution, or (one rank) the holder itself.
  std::vector<std::pair<int64_t, int64_t>> writes;  // (writer, piece index)
  if (!options.groups.empty()) {
    CKPT_ASSIGN_OR_RETURN(auto writers, MainReplicaWritersPerGroup(per_rank, options.groups));
    for (const auto& [id, rank] : writers) {
      writes.emplace_back(rank,
                          piece_of_id_rank.at(std::make_pair(first_piece_of_id.at(&id), rank)));
    }
  } else {
    CKPT_ASSIGN_OR_RETURN(std::optional<MainReplicaDistribution> distribution,
                          DetermineMainReplicaDistribution(per_rank, num_ranks,
                                                           /*ignore_groups=*/false));
    if (distribution) {
      for (const auto& [id, rank] : distribution->main_rank_for_shard) {
        writes.emplace_back(rank,
                            piece_of_id_rank.at(std::make_pair(first_piece_of_id.at(&id), rank)));
      }
    } else {
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (pieces[i].is_main_replica()) writes.emplace_back(pieces[i].rank, i);
      }
    }
  }

  std::vector<std::vector<PlannedPiece>> by_writer(num_ranks);
  std::vector<int64_t> bytes_of_writer(num_ranks, 0);
  for (const auto& [writer, index] : writes) {
    const TensorPiece& p = pieces[index];
    by_writer[writer].push_back(
        PlannedPiece{p.key, p.dtype, p.global_shape, p.region, size_of[index], index});
    bytes_of_writer[writer] += size_of[index];
  }
  SavePlan plan;
  plan.num_ranks = num_ranks;
  for (int64_t rank = 0; rank < num_ranks; ++rank) {
    if (by_writer[rank].empty()) continue;
    WriterPlan w;
    w.rank = rank;
    w.total_bytes = bytes_of_writer[rank];
    w.files = PackFiles(rank, std::move(by_writer[rank]), w.total_bytes, options.target_file_bytes);
    plan.writers.push_back(std::move(w));
  }
  return plan;
}

}  // namespace ckpt
