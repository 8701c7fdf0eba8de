#include "planner/load_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/distribute.h"
#include "sharding/box_index.h"
#include "sharding/coverage.h"
#include "sharding/piece_id.h"

namespace ckpt {
namespace {

// Part of one stored piece that one request needs.
struct Need {
  int64_t piece = 0;
  int64_t request = 0;
  std::vector<CopyRun> runs;  // src_offset local to the piece, ascending
};

bool BroadcastLike(ExchangeAlgorithm a) { return a != ExchangeAlgorithm::kOverlapAllToAll; }

std::string PieceName(const StoredPieceInfo& p) {
  return absl::StrCat("tensor '", p.key, "': stored piece ", p.region.DebugString(), " in file ",
                      p.file);
}

std::string RequestName(const LoadRequest& r) {
  return absl::StrCat("tensor '", r.key, "': rank ", r.rank, " request ", r.region.DebugString());
}

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Packs read units into waves so that no rank's bytes in flight exceed the budget.
class WavePacker {
 public:
  WavePacker(int64_t num_ranks, int64_t budget, ExchangeAlgorithm algorithm)
      : flight_(num_ranks, 0), budget_(budget), algorithm_(algorithm) {}

  // Adds a unit whose per-rank receive costs (all-to-all only) are `receives`.
  void Add(ReadUnit unit, std::vector<Delivery> deliveries,
           const std::vector<std::pair<int64_t, int64_t>>& receives) {
    if (!Fits(unit, receives)) Close();
    if (waves_.empty() || closed_) {
      waves_.emplace_back();
      closed_ = false;
    }
    LoadWave& wave = waves_.back();
    const int64_t index = static_cast<int64_t>(wave.units.size());
    if (BroadcastLike(algorithm_) && unit.exchanged) {
      broadcast_total_ += unit.byte_length;
    } else {
      Charge(unit.reader, unit.byte_length);
      for (const auto& [rank, bytes] : receives) Charge(rank, bytes);
    }
    for (Delivery& d : deliveries) {
      d.unit = index;
      wave.deliveries.push_back(std::move(d));
    }
    wave.units.push_back(std::move(unit));
    wave.peak_bytes_in_flight = std::max(wave.peak_bytes_in_flight, broadcast_total_ + max_flight_);
  }

  std::vector<LoadWave> Finish() {
    Close();
    return std::move(waves_);
  }

 private:
  bool Fits(const ReadUnit& unit, const std::vector<std::pair<int64_t, int64_t>>& receives) const {
    if (BroadcastLike(algorithm_)) {
      const int64_t base = broadcast_total_ + (unit.exchanged ? max_flight_ : flight_[unit.reader]);
      return base + unit.byte_length <= budget_;
    }
    if (flight_[unit.reader] + unit.byte_length > budget_) return false;
    for (const auto& [rank, bytes] : receives) {
      if (flight_[rank] + bytes > budget_) return false;
    }
    return true;
  }

  void Charge(int64_t rank, int64_t bytes) {
    if (flight_[rank] == 0) touched_.push_back(rank);
    flight_[rank] += bytes;
    max_flight_ = std::max(max_flight_, flight_[rank]);
  }

  void Close() {
    for (int64_t r : touched_) flight_[r] = 0;
    touched_.clear();
    max_flight_ = 0;
    broadcast_total_ = 0;
    closed_ = true;
  }

  std::vector<int64_t> flight_;  // per-rank unit buffers + receives (all-to-all) this wave
  std::vector<int64_t> touched_;
  int64_t max_flight_ = 0;
  int64_t broadcast_total_ = 0;  // broadcast-like: every rank holds every exchanged unit
  const int64_t budget_;
  const ExchangeAlgorithm algorithm_;
  std::vector<LoadWave> waves_;
  bool closed_ = true;
};

// Clips `runs` (ascending src) to piece elements [a, b); src offsets become relative to a.
std::vector<CopyRun> ClipRuns(const std::vector<CopyRun>& runs, int64_t a, int64_t b) {
  std::vector<CopyRun> out;
  auto it = std::upper_bound(runs.begin(), runs.end(), a, [](int64_t v, const CopyRun& r) {
    return v < r.src_offset + r.length;
  });
  for (; it != runs.end() && it->src_offset < b; ++it) {
    const int64_t s = std::max(a, it->src_offset);
    const int64_t e = std::min(b, it->src_offset + it->length);
    if (s < e) out.push_back(CopyRun{s - a, it->dst_offset + (s - it->src_offset), e - s});
  }
  return out;
}

// Megatron's gather rounds: per dtype (by name), round k all-gathers each rank's k-th
// exchanged unit, in distribution order.
void AddGatherRounds(LoadWave& wave) {
  std::map<std::string, std::map<int64_t, std::vector<int64_t>>> units_by_dtype;  // -> rank
  for (size_t u = 0; u < wave.units.size(); ++u) {
    const ReadUnit& unit = wave.units[u];
    if (!unit.exchanged) continue;
    units_by_dtype[std::string(DTypeName(unit.dtype))][unit.reader].push_back(u);
  }
  for (const auto& [name, by_rank] : units_by_dtype) {
    size_t rounds = 0;
    for (const auto& [rank, units] : by_rank) rounds = std::max(rounds, units.size());
    for (size_t k = 0; k < rounds; ++k) {
      GatherRound round;
      round.dtype = wave.units[by_rank.begin()->second.front()].dtype;
      for (const auto& [rank, units] : by_rank) {
        if (k < units.size()) round.unit_of_rank.emplace_back(rank, units[k]);
      }
      wave.rounds.push_back(std::move(round));
    }
  }
}

}  // namespace

int64_t DistinctSourceElements(absl::Span<const Delivery* const> deliveries) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const Delivery* d : deliveries) {
    for (const CopyRun& r : d->runs) spans.emplace_back(r.src_offset, r.src_offset + r.length);
  }
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, end = std::numeric_limits<int64_t>::min();
  for (const auto& [a, b] : spans) {
    const int64_t start = std::max(a, end);
    if (b > start) total += b - start;
    end = std::max(end, b);
  }
  return total;
}

int64_t WaveBytesInFlight(const LoadWave& wave, ExchangeAlgorithm algorithm, int64_t rank) {
  int64_t bytes = 0;
  for (const ReadUnit& u : wave.units) {
    if (u.reader == rank || (BroadcastLike(algorithm) && u.exchanged)) bytes += u.byte_length;
  }
  if (!BroadcastLike(algorithm)) {
    // A rank receives each needed element of a unit once, whatever its number of requests.
    std::map<int64_t, std::vector<const Delivery*>> by_unit;
    for (const Delivery& d : wave.deliveries) {
      if (d.dst_rank == rank && d.src_rank != rank) by_unit[d.unit].push_back(&d);
    }
    for (const auto& [unit, deliveries] : by_unit) {
      bytes += DistinctSourceElements(deliveries) * wave.units[unit].elem_size;
    }
  }
  return bytes;
}

namespace {

// The inputs of a load plan, indexed by tensor.
struct PlanInputs {
  absl::Span<const TensorMeta> tensors;
  absl::Span<const StoredPieceInfo> pieces;
  absl::Span<const LoadRequest> requests;
  int64_t num_ranks = 0;
  absl::flat_hash_map<std::string, int64_t> tensor_of_key;
  std::vector<std::vector<int64_t>> pieces_of, requests_of;  // by tensor
};

// Validate: every tensor once with a sane shape, every piece and request on a known tensor
// within its shape (pieces with the right byte length), every request's rank in range.
absl::Status IndexInputs(PlanInputs& in) {
  const auto& tensors = in.tensors;
  const auto& pieces = in.pieces;
  const auto& requests = in.requests;
  const int64_t num_ranks = in.num_ranks;
  auto& tensor_of_key = in.tensor_of_key;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (!tensor_of_key.try_emplace(tensors[t].key, t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensors[t].key, "' is listed twice in the checkpoint"));
    }
    CKPT_RETURN_IF_ERROR(CheckedNumElements(tensors[t].global_shape).status());
  }
  auto& pieces_of = in.pieces_of;
  auto& requests_of = in.requests_of;
  pieces_of.resize(tensors.size());
  requests_of.resize(tensors.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StoredPieceInfo& p = pieces[i];
    auto t = tensor_of_key.find(p.key);
    if (t == tensor_of_key.end()) {
      return absl::InvalidArgumentError(PieceName(p) + ": no such tensor in the checkpoint");
    }
    const TensorMeta& tensor = tensors[t->second];
    if (absl::Status s = ValidateRegion(p.region, tensor.global_shape); !s.ok()) {
      return Annotate(s, PieceName(p));
    }
    const int64_t elems = p.region.NumElements();
    const int64_t elem = DTypeSize(tensor.dtype);
    if (elems > std::numeric_limits<int64_t>::max() / elem || p.byte_length != elems * elem ||
        p.byte_offset < 0) {
      return absl::InvalidArgumentError(absl::StrCat(PieceName(p), ": ", p.byte_length,
                                                     " bytes at offset ", p.byte_offset, " for ",
                                                     elems, " elements of ", elem, " bytes"));
    }
    pieces_of[t->second].push_back(static_cast<int64_t>(i));
  }
  for (size_t j = 0; j < requests.size(); ++j) {
    const LoadRequest& r = requests[j];
    if (r.rank < 0 || r.rank >= num_ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat(RequestName(r), ": rank outside [0, ", num_ranks, ")"));
    }
    auto t = tensor_of_key.find(r.key);
    if (t == tensor_of_key.end()) {
      return absl::InvalidArgumentError(RequestName(r) + ": no such tensor in the checkpoint");
    }
    if (absl::Status s = ValidateRegion(r.region, tensors[t->second].global_shape); !s.ok()) {
      return Annotate(s, RequestName(r));
    }
    requests_of[t->second].push_back(static_cast<int64_t>(j));
  }
  return absl::OkStatus();
}

// The overlaps of stored pieces and requests, tensor by tensor; InvalidArgument naming the
// request unless the overlaps tile every request exactly.
absl::StatusOr<std::vector<Need>> FindNeeds(const PlanInputs& in) {
  const auto& tensors = in.tensors;
  const auto& pieces = in.pieces;
  const auto& requests = in.requests;
  const auto& pieces_of = in.pieces_of;
  const auto& requests_of = in.requests_of;
  std::vector<Need> needs;
  // (dst offset, length) of every run feeding each request: it must tile the request exactly.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> written(requests.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (pieces_of[t].empty() || requests_of[t].empty()) continue;
    const auto& shape = tensors[t].global_shape;
    std::vector<std::pair<int64_t, int64_t>> pairs;
    if (shape.empty()) {  // 0-d: every piece meets every request
      for (int64_t i : pieces_of[t]) {
        for (int64_t j : requests_of[t]) pairs.emplace_back(i, j);
      }
    } else {
      std::vector<Region> piece_boxes, request_boxes;
      for (int64_t i : pieces_of[t]) piece_boxes.push_back(pieces[i].region);
      for (int64_t j : requests_of[t]) request_boxes.push_back(requests[j].region);
      ForEachIntersectingPair(piece_boxes, request_boxes, [&](int64_t a, int64_t b) {
        pairs.emplace_back(pieces_of[t][a], requests_of[t][b]);
        return true;
      });
      std::sort(pairs.begin(), pairs.end());
    }
    for (const auto& [i, j] : pairs) {
      CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs,
                            OverlapRuns(pieces[i].region, requests[j].region, shape));
      if (runs.empty()) continue;
      std::sort(runs.begin(), runs.end(),
                [](const CopyRun& a, const CopyRun& b) { return a.src_offset < b.src_offset; });
      for (const CopyRun& run : runs) written[j].emplace_back(run.dst_offset, run.length);
      needs.push_back(Need{i, j, std::move(runs)});
    }
  }
  for (size_t j = 0; j < requests.size(); ++j) {
    std::optional<RunFault> fault =
        FindRunTilingFault(std::move(written[j]), requests[j].region.NumElements());
    if (fault.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          RequestName(requests[j]), ": ",
          fault->hole ? absl::StrCat("elements [", fault->offset, ", ", fault->end,
                                     ") of it are stored in no piece of the checkpoint")
                      : absl::StrCat("element ", fault->offset,
                                     " of it is stored by more than one piece (they overlap)")));
    }
  }
  return needs;
}

// Which rank reads what of each needed piece.
struct ReaderChoice {
  std::vector<std::vector<int64_t>> needs_of_piece;
  std::vector<std::pair<int64_t, int64_t>> span;  // needed elements of each piece
  std::vector<int64_t> elem_size;
  std::vector<int64_t> piece_of_shard;  // the distribution's shards -> pieces
  // Pieces whose needing ranks want disjoint spans of storage: each rank reads its own span
  // (rank, lo, hi), as many bytes from storage as one read and none over the network.
  std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t>>> own_reads;
  std::vector<ShardAssignment> assignment;  // one reader per other needed piece
};

// Needed span and needing ranks of every piece; then one reader per piece (Megatron's greedy
// distribution).
absl::StatusOr<ReaderChoice> ChooseReaders(const PlanInputs& in, const std::vector<Need>& needs,
                                           const LoadPlanOptions& options) {
  const auto& tensors = in.tensors;
  const auto& pieces = in.pieces;
  const auto& requests = in.requests;
  const auto& tensor_of_key = in.tensor_of_key;
  ReaderChoice c;
  auto& needs_of_piece = c.needs_of_piece;
  auto& span = c.span;
  auto& elem_size = c.elem_size;
  auto& piece_of_shard = c.piece_of_shard;
  auto& own_reads = c.own_reads;
  needs_of_piece.resize(pieces.size());
  for (size_t n = 0; n < needs.size(); ++n) needs_of_piece[needs[n].piece].push_back(n);
  span.assign(pieces.size(), {0, 0});
  elem_size.assign(pieces.size(), 0);
  DistributionInput input;
  input.num_ranks = in.num_ranks;
  own_reads.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (needs_of_piece[i].empty()) continue;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    std::vector<int64_t> ranks;
    std::map<int64_t, std::pair<int64_t, int64_t>> span_of_rank;
    for (int64_t n : needs_of_piece[i]) {
      const int64_t a = needs[n].runs.front().src_offset;
      const int64_t b = needs[n].runs.back().src_offset + needs[n].runs.back().length;
      lo = std::min(lo, a);
      hi = std::max(hi, b);
      const int64_t rank = requests[needs[n].request].rank;
      ranks.push_back(rank);
      auto [it, fresh] = span_of_rank.emplace(rank, std::make_pair(a, b));
      if (!fresh) it->second = {std::min(it->second.first, a), std::max(it->second.second, b)};
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    span[i] = {lo, hi};
    elem_size[i] = DTypeSize(tensors[tensor_of_key.at(pieces[i].key)].dtype);
    const bool restricted = !options.readers_of_piece.empty();
    if (restricted) {
      if (options.readers_of_piece.size() != pieces.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("readers_of_piece names ", options.readers_of_piece.size(),
                         " pieces; the checkpoint has ", pieces.size()));
      }
      ranks = options.readers_of_piece[i];
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      if (ranks.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat(PieceName(pieces[i]), " is needed but no rank may read it"));
      }
    }
    if (!restricted && options.split_disjoint_reads && ranks.size() > 1) {
      std::vector<std::tuple<int64_t, int64_t, int64_t>> by_start;
      for (const auto& [rank, ab] : span_of_rank) by_start.emplace_back(ab.first, ab.second, rank);
      std::sort(by_start.begin(), by_start.end());
      bool disjoint = true;
      for (size_t k = 1; k < by_start.size() && disjoint; ++k) {
        disjoint = std::get<0>(by_start[k]) >= std::get<1>(by_start[k - 1]);
      }
      if (disjoint) {
        for (const auto& [a, b, rank] : by_start) own_reads[i].emplace_back(rank, a, b);
        continue;
      }
    }
    piece_of_shard.push_back(static_cast<int64_t>(i));
    const bool cross_group =
        std::none_of(needs_of_piece[i].begin(), needs_of_piece[i].end(),
                     [&](int64_t n) { return requests[needs[n].request].main_replica; });
    input.AddShard(PieceId{pieces[i].key, pieces[i].region.offsets, pieces[i].region.flat},
                   (hi - lo) * elem_size[i], std::move(ranks), cross_group);
  }
  absl::StatusOr<std::vector<ShardAssignment>> assignment = DistributeShardsToRanks(input);
  if (!assignment.ok()) return Annotate(assignment.status(), "choosing readers");
  c.assignment = *std::move(assignment);
  return c;
}

// Units of piece i read by `reader` covering [span_lo, span_hi), for the needs of `only_rank`
// (-1: every needing rank), cut to the budget and packed into waves.
absl::Status EmitUnits(const PlanInputs& in, const std::vector<Need>& needs, const ReaderChoice& c,
                       const LoadPlanOptions& options, int64_t i, int64_t reader, int64_t span_lo,
                       int64_t span_hi, int64_t only_rank, LoadPlan& plan, WavePacker& packer) {
  const auto& tensors = in.tensors;
  const auto& pieces = in.pieces;
  const auto& requests = in.requests;
  const auto& tensor_of_key = in.tensor_of_key;
  const auto& needs_of_piece = c.needs_of_piece;
  const auto& elem_size = c.elem_size;
  const StoredPieceInfo& p = pieces[i];
  const int64_t elem = elem_size[i];
  if (options.memory_budget_bytes < elem) {
    return absl::InvalidArgumentError(absl::StrCat("memory budget of ", options.memory_budget_bytes,
                                                   " bytes cannot hold one element of ",
                                                   PieceName(p)));
  }
  plan.reader_of_piece.emplace_back(i, reader);
  const int64_t chunk = options.memory_budget_bytes / elem;
  for (int64_t a0 = span_lo; a0 < span_hi; a0 += chunk) {
    const int64_t b0 = std::min(span_hi, a0 + chunk);
    // Deliveries of this chunk, then the unit shrunk to the elements they touch.
    std::vector<Delivery> deliveries;
    int64_t lo = b0, hi = a0;
    for (int64_t n : needs_of_piece[i]) {
      if (only_rank >= 0 && requests[needs[n].request].rank != only_rank) continue;
      std::vector<CopyRun> runs = ClipRuns(needs[n].runs, a0, b0);
      if (runs.empty()) continue;
      Delivery d;
      d.request = needs[n].request;
      d.src_rank = reader;
      d.dst_rank = requests[d.request].rank;
      for (const CopyRun& r : runs) d.elements += r.length;
      lo = std::min(lo, a0 + runs.front().src_offset);
      hi = std::max(hi, a0 + runs.back().src_offset + runs.back().length);
      d.runs = std::move(runs);
      deliveries.push_back(std::move(d));
    }
    if (deliveries.empty()) continue;
    ReadUnit unit;
    unit.piece = i;
    unit.reader = reader;
    unit.file = p.file;
    unit.first_element = lo;
    unit.num_elements = hi - lo;
    unit.elem_size = elem;
    unit.dtype = tensors[tensor_of_key.at(p.key)].dtype;
    unit.file_offset = p.byte_offset + lo * elem;
    unit.byte_length = (hi - lo) * elem;
    std::map<int64_t, std::vector<const Delivery*>> remote;  // by receiving rank
    for (Delivery& d : deliveries) {
      for (CopyRun& r : d.runs) r.src_offset -= lo - a0;
      if (d.dst_rank != reader) {
        unit.exchanged = true;
        remote[d.dst_rank].push_back(&d);
      }
    }
    std::vector<std::pair<int64_t, int64_t>> receives;
    for (const auto& [rank, ds] : remote) {
      receives.emplace_back(rank, DistinctSourceElements(ds) * elem);
    }
    packer.Add(std::move(unit), std::move(deliveries), receives);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadPlan> BuildLoadPlan(absl::Span<const TensorMeta> tensors,
                                       absl::Span<const StoredPieceInfo> pieces,
                                       absl::Span<const LoadRequest> requests, int64_t num_ranks,
                                       const LoadPlanOptions& options) {
  if (num_ranks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("load plan needs ranks, got ", num_ranks));
  }
  PlanInputs in;
  in.tensors = tensors;
  in.pieces = pieces;
  in.requests = requests;
  in.num_ranks = num_ranks;
  CKPT_RETURN_IF_ERROR(IndexInputs(in));
  CKPT_ASSIGN_OR_RETURN(std::vector<Need> needs, FindNeeds(in));
  CKPT_ASSIGN_OR_RETURN(ReaderChoice readers, ChooseReaders(in, needs, options));
  LoadPlan plan;
  plan.num_ranks = num_ranks;
  plan.algorithm = options.algorithm;
  WavePacker packer(num_ranks, options.memory_budget_bytes, options.algorithm);
  for (const ShardAssignment& a : readers.assignment) {
    const int64_t i = readers.piece_of_shard[a.shard];
    CKPT_RETURN_IF_ERROR(EmitUnits(in, needs, readers, options, i, a.rank, readers.span[i].first,
                                   readers.span[i].second, -1, plan, packer));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (const auto& [rank, a, b] : readers.own_reads[i]) {
      CKPT_RETURN_IF_ERROR(EmitUnits(in, needs, readers, options, static_cast<int64_t>(i), rank, a,
                                     b, rank, plan, packer));
    }
  }
  plan.waves = packer.Finish();
  if (options.algorithm == ExchangeAlgorithm::kGatherRounds) {
    for (LoadWave& wave : plan.waves) AddGatherRounds(wave);
  }
  return plan;
}

}  // namespace ckpt
