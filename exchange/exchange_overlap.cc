// The "overlap_all_to_all" exchange: every rank receives exactly the elements of stored shards
// that overlap the regions it needs, in waves of budgeted indexed all-to-all-v.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "exchange/exchange.h"
#include "exchange/exchange_internal.h"
#include "exchange/overlap_waves.h"
#include "sharding/overlap.h"

namespace ckpt {
namespace {

using exchange_internal::WaveRecorder;

// Elements of stored shard `stored` that rank `dst` needs for its need `need`.
struct Transfer {
  int src;
  int dst;
  int stored;  // distribution index
  int need;    // index into plan.needs[dst]
  int64_t elements;
  int64_t elem_size;
  std::vector<CopyRun> runs;  // computed only when this rank is src or dst
};

// A window [begin, end) of a transfer's elements (in run order) moved in one wave.
struct Piece {
  int transfer;
  int64_t begin;
  int64_t end;
};

// Calls fn(src_elem, dst_elem, count) for the part of `runs` covering element window
// [begin, end) of the run stream.
template <typename Fn>
void ForEachRunPart(const std::vector<CopyRun>& runs, int64_t begin, int64_t end, Fn fn) {
  int64_t base = 0;
  for (const CopyRun& r : runs) {
    int64_t lo = std::max(begin, base), hi = std::min(end, base + r.length);
    if (lo < hi) fn(r.src_offset + (lo - base), r.dst_offset + (lo - base), hi - lo);
    base += r.length;
    if (base >= end) break;
  }
}

// Step 1: every (stored shard, needed region) overlap, in (dst rank, need, distribution) order.
// Runs are computed only for transfers this rank `me` takes part in. Refuses a need stored
// with another dtype or shape, or not fully covered.
absl::StatusOr<std::vector<Transfer>> FindTransfers(const ExchangePlan& plan, int n, int me) {
  absl::flat_hash_map<std::string, std::vector<int>> stored_by_key;
  for (int i = 0; i < static_cast<int>(plan.distribution.size()); ++i) {
    stored_by_key[plan.distribution[i].spec.id.key].push_back(i);
  }
  std::vector<Transfer> transfers;
  for (int r = 0; r < n; ++r) {
    for (int t = 0; t < static_cast<int>(plan.needs[r].size()); ++t) {
      const PieceSpec& need = plan.needs[r][t];
      CKPT_RETURN_IF_ERROR(ValidateRegion(need.region, need.global_shape));
      int64_t covered = 0;
      auto it = stored_by_key.find(need.id.key);
      if (it != stored_by_key.end()) {
        for (int i : it->second) {
          const DistributedPiece& d = plan.distribution[i];
          if (d.spec.global_shape != need.global_shape || d.spec.dtype != need.dtype) {
            return absl::InvalidArgumentError(absl::StrCat(
                "overlap exchange: tensor '", need.id.key, "' is stored as ",
                DTypeName(d.spec.dtype), ShapeString(d.spec.global_shape), " but rank ", r,
                " needs it as ", DTypeName(need.dtype), ShapeString(need.global_shape)));
          }
          const bool involved = d.main_rank == me || r == me;
          Transfer tr{d.main_rank, r, i, t, 0, DTypeSize(need.dtype), {}};
          if (involved) {
            CKPT_ASSIGN_OR_RETURN(tr.runs,
                                  OverlapRuns(d.spec.region, need.region, need.global_shape));
            for (const CopyRun& run : tr.runs) tr.elements += run.length;
          } else {
            CKPT_ASSIGN_OR_RETURN(tr.elements,
                                  OverlapElements(d.spec.region, need.region, need.global_shape));
          }
          if (tr.elements == 0) continue;
          covered += tr.elements;
          if (plan.own_share && !involved) continue;  // between two other ranks: not ours
          transfers.push_back(std::move(tr));
        }
      }
      if (covered < need.region.NumElements()) {
        return absl::FailedPreconditionError(
            absl::StrCat("overlap exchange: rank ", r, " needs region ", need.region.DebugString(),
                         " of '", need.id.key, "' (", need.region.NumElements(),
                         " elements) but stored shards cover only ", covered));
      }
    }
  }
  return transfers;
}

// Step 2: local overlaps are plain copies.
absl::Status CopyLocalTransfers(const ExchangePlan& plan, int me,
                                const std::vector<Transfer>& transfers, const ShardBuffers& loaded,
                                const std::vector<absl::Span<char>>& targets) {
  for (const Transfer& tr : transfers) {
    if (tr.src != me || tr.dst != me) continue;
    const PieceSpec& stored = plan.distribution[tr.stored].spec;
    const std::string& src = loaded.at(stored.id);
    char* dst = targets[tr.need].data();
    if (src.data() == dst) {
      // The caller made the loaded buffer the destination: nothing to copy if it holds the
      // same region.
      const PieceSpec& need = plan.needs[me][tr.need];
      if (stored.region == need.region) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("overlap exchange: rank ", me, "'s destination for ", need.id.DebugString(),
                       " region ", need.region.DebugString(), " is the loaded buffer of region ",
                       stored.region.DebugString()));
    }
    CopyRuns(tr.runs, tr.elem_size, src.data(), dst);
  }
  return absl::OkStatus();
}

// The error for a transfer whose single element does not fit the per-wave budget.
absl::Status BudgetBelowOneElement(const ExchangePlan& plan, const Transfer& tr, int64_t budget) {
  return absl::InvalidArgumentError(absl::StrCat("overlap exchange: memory budget of ", budget,
                                                 " bytes per wave is smaller than one element (",
                                                 tr.elem_size, " bytes) of '",
                                                 plan.needs[tr.dst][tr.need].id.key, "'"));
}

// Step 3: remote overlaps in waves: greedily, in transfer order, while every rank's send +
// receive staging stays within the budget; a transfer larger than the budget is cut into
// element windows. Identical on every rank.
absl::StatusOr<std::vector<std::vector<Piece>>> PlanRemoteWaves(
    const ExchangePlan& plan, const std::vector<Transfer>& transfers, int n, int64_t budget) {
  std::vector<std::vector<Piece>> waves_plan;
  std::vector<int64_t> load(n, 0);
  auto new_wave = [&] {
    waves_plan.emplace_back();
    std::fill(load.begin(), load.end(), 0);
  };
  for (int k = 0; k < static_cast<int>(transfers.size()); ++k) {
    const Transfer& tr = transfers[k];
    if (tr.src == tr.dst) continue;
    if (tr.elem_size > budget) return BudgetBelowOneElement(plan, tr, budget);
    const int64_t window = budget / tr.elem_size;
    for (int64_t begin = 0; begin < tr.elements; begin += window) {
      const int64_t end = std::min(tr.elements, begin + window);
      const int64_t bytes = (end - begin) * tr.elem_size;
      if (waves_plan.empty() || load[tr.src] + bytes > budget || load[tr.dst] + bytes > budget) {
        new_wave();
      }
      load[tr.src] += bytes;
      load[tr.dst] += bytes;
      waves_plan.back().push_back({k, begin, end});
    }
  }
  return waves_plan;
}

// Step 3 for an own-share plan (ExchangePlan::own_share), which lists only the transfers this
// rank takes part in: per peer, in transfer order (the same on both ranks of a pair), greedily
// into sub-waves of at most budget / max(peer count of either rank) bytes of the pair's
// transfers (a transfer larger than that is cut into element windows, at least one element
// each), so no rank's sub-wave exceeds the budget. One all-gather tells every rank its peers'
// peer counts, a second the number of sub-waves (the largest any pair needs).
absl::StatusOr<std::vector<std::vector<Piece>>> PlanPairWaves(
    const ExchangePlan& plan, const std::vector<Transfer>& transfers, Communicator& comm,
    int64_t budget, absl::Time deadline) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::vector<int>> by_peer(n);
  for (int k = 0; k < static_cast<int>(transfers.size()); ++k) {
    const Transfer& tr = transfers[k];
    if (tr.src == tr.dst) continue;
    if (tr.elem_size > budget) return BudgetBelowOneElement(plan, tr, budget);
    by_peer[tr.src == me ? tr.dst : tr.src].push_back(k);
  }
  int64_t peers = 0;
  for (const std::vector<int>& k : by_peer) peers += k.empty() ? 0 : 1;
  std::vector<int64_t> peer_counts(n, 0);
  CKPT_RETURN_IF_ERROR(comm.AllGather(&peers, sizeof(int64_t), peer_counts.data(), deadline));
  std::vector<std::vector<Piece>> waves_plan;
  for (int p = 0; p < n; ++p) {
    if (by_peer[p].empty()) continue;
    const int64_t cap = std::max<int64_t>(1, budget / std::max(peers, peer_counts[p]));
    size_t wave = 0;
    int64_t load = 0;
    for (int k : by_peer[p]) {
      const Transfer& tr = transfers[k];
      const int64_t window = std::max<int64_t>(1, cap / tr.elem_size);
      for (int64_t begin = 0; begin < tr.elements; begin += window) {
        const int64_t end = std::min(tr.elements, begin + window);
        const int64_t bytes = (end - begin) * tr.elem_size;
        if (load > 0 && load + bytes > cap) {
          ++wave;
          load = 0;
        }
        load += bytes;
        if (waves_plan.size() <= wave) waves_plan.resize(wave + 1);
        waves_plan[wave].push_back({k, begin, end});
      }
    }
  }
  const int64_t mine = static_cast<int64_t>(waves_plan.size());
  std::vector<int64_t> counts(n, 0);
  CKPT_RETURN_IF_ERROR(comm.AllGather(&mine, sizeof(int64_t), counts.data(), deadline));
  waves_plan.resize(*std::max_element(counts.begin(), counts.end()));
  return waves_plan;
}

// The most bytes this rank sends and receives in one wave.
size_t MaxWaveBytes(const std::vector<std::vector<Piece>>& waves_plan,
                    const std::vector<Transfer>& transfers, int me) {
  size_t max_bytes = 0;
  for (const std::vector<Piece>& wave : waves_plan) {
    size_t mine = 0;
    for (const Piece& p : wave) {
      const Transfer& tr = transfers[p.transfer];
      if (tr.src == me || tr.dst == me) mine += (p.end - p.begin) * tr.elem_size;
    }
    max_bytes = std::max(max_bytes, mine);
  }
  return max_bytes;
}

}  // namespace

absl::Status ExchangeOverlapAllToAllInto(Communicator& comm, const ExchangePlan& plan,
                                         const ShardBuffers& loaded,
                                         const DestinationBuffers& destinations,
                                         const ExchangeOptions& options, ExchangeReport* report) {
  using namespace exchange_internal;
  CKPT_ASSIGN_OR_RETURN(DistributionIndex index, IndexPlan(plan, comm));
  CKPT_RETURN_IF_ERROR(CheckLoaded(plan, index, comm.rank(), loaded));
  CKPT_ASSIGN_OR_RETURN(std::vector<absl::Span<char>> targets,
                        CheckDestinations(plan, comm.rank(), loaded, destinations));
  const int n = comm.size();
  const int me = comm.rank();
  CKPT_ASSIGN_OR_RETURN(std::vector<Transfer> transfers, FindTransfers(plan, n, me));
  CKPT_RETURN_IF_ERROR(CopyLocalTransfers(plan, me, transfers, loaded, targets));
  const int64_t budget = options.memory_budget_bytes;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::vector<Piece>> waves_plan,
                        plan.own_share
                            ? PlanPairWaves(plan, transfers, comm, budget, options.deadline)
                            : PlanRemoteWaves(plan, transfers, n, budget));

  // Step 4: run the waves: per peer, the runs this rank sends and receives, in wave order.
  WaveRunOptions run;
  run.deadline = options.deadline;
  run.max_wave_bytes = MaxWaveBytes(waves_plan, transfers, me);
  auto build = [&](int k, WaveStreams& streams) {
    for (const Piece& piece : waves_plan[k]) {
      const Transfer& tr = transfers[piece.transfer];
      const int64_t es = tr.elem_size;
      if (tr.src == me) {
        char* src = const_cast<char*>(loaded.at(plan.distribution[tr.stored].spec.id).data());
        std::vector<MemoryRun>& runs = streams.send[tr.dst];
        ForEachRunPart(tr.runs, piece.begin, piece.end, [&](int64_t s, int64_t, int64_t count) {
          AppendRun(runs, src + s * es, count * es);
        });
      }
      if (tr.dst == me) {
        char* dst = targets[tr.need].data();
        std::vector<MemoryRun>& runs = streams.recv[tr.src];
        ForEachRunPart(tr.runs, piece.begin, piece.end, [&](int64_t, int64_t d, int64_t count) {
          AppendRun(runs, dst + d * es, count * es);
        });
      }
    }
  };
  StagingArena own_staging;
  StagingArena& staging = options.staging != nullptr ? *options.staging : own_staging;
  WaveRecorder recorder(budget);
  CKPT_RETURN_IF_ERROR(
      RunWaves(comm, static_cast<int>(waves_plan.size()), build, run, staging, recorder));
  recorder.Finish("overlap_all_to_all", report);
  return absl::OkStatus();
}

absl::StatusOr<ShardBuffers> ExchangeOverlapAllToAll(Communicator& comm, const ExchangePlan& plan,
                                                     const ShardBuffers& loaded,
                                                     const ExchangeOptions& options,
                                                     ExchangeReport* report) {
  return exchange_internal::RunAllocating(ExchangeOverlapAllToAllInto, comm, plan, loaded, options,
                                          report);
}

}  // namespace ckpt
