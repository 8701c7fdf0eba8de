#include "worker/load_wave_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/coverage.h"
#include "sharding/overlap.h"

namespace ckpt::worker {
namespace {

// The distribution entry of one unit: the (part of the) stored piece its reader reads.
absl::StatusOr<DistributedPiece> UnitShard(const pb::LoadUnitEntry& u, const pb::Manifest& manifest,
                                           const TensorLookup& tensors, int world,
                                           const std::string& where) {
  if (u.piece() < 0 || u.piece() >= manifest.pieces_size() || u.reader() < 0 ||
      u.reader() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unit names piece ", u.piece(), " read by rank ", u.reader()));
  }
  const pb::StoredPiece& piece = manifest.pieces(u.piece());
  const pb::TensorMeta* meta = tensors(piece.key());
  absl::StatusOr<Region> region = RegionFromProto(piece.region());
  absl::StatusOr<DType> dtype = meta == nullptr
                                    ? absl::StatusOr<DType>(absl::NotFoundError(piece.key()))
                                    : DTypeFromProto(meta->dtype());
  if (!region.ok() || !dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": stored piece of ", piece.key(), " in ",
                                                   piece.file(),
                                                   " is not readable from the manifest"));
  }
  const int64_t n = region->NumElements();
  if (u.first_element() < 0 || u.num_elements() <= 0 || u.first_element() + u.num_elements() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unit of ", piece.key(), " reads elements outside its piece"));
  }
  DistributedPiece d;
  d.main_rank = u.reader();
  d.spec.dtype = *dtype;
  d.spec.global_shape.assign(meta->global_shape().begin(), meta->global_shape().end());
  d.spec.region = *region;
  if (u.first_element() != 0 || u.num_elements() != n) {
    const int64_t base = region->flat.has_value() ? region->flat->start : 0;
    d.spec.region.flat =
        FlatRange{base + u.first_element(), base + u.first_element() + u.num_elements()};
  }
  d.spec.id = PieceId{piece.key(), region->offsets, d.spec.region.flat};
  return d;
}

// Adds what each delivery's rank must receive to out->plan.needs (one need per shard id and
// rank) and, for `me`, which requests each need feeds.
absl::Status AddDeliveredNeeds(const pb::LoadWaveEntry& wave,
                               const std::vector<LoadRequest>& requests, int me, bool narrow,
                               const std::string& where,
                               std::vector<std::map<PieceId, int, PieceIdLess>>& need_index,
                               WaveExchange* out) {
  ExchangePlan& plan = out->plan;
  for (const pb::LoadDeliveryEntry& e : wave.deliveries()) {
    // Request -1 (own-share parts): a request of another rank this part does not carry; it
    // receives the whole unit, which only an algorithm that is not narrow sends.
    const bool elsewhere = e.request() == -1 && !narrow && e.dst_rank() != me &&
                           e.dst_rank() >= 0 && e.dst_rank() < plan.num_ranks;
    if (e.unit() < 0 || e.unit() >= static_cast<int>(plan.distribution.size()) ||
        (!elsewhere && (e.request() < 0 || e.request() >= static_cast<int>(requests.size()) ||
                        requests[e.request()].rank != e.dst_rank()))) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": inconsistent delivery"));
    }
    const PieceSpec& unit = plan.distribution[e.unit()].spec;
    const int r = e.dst_rank();
    PieceSpec need = elsewhere ? unit : NeededPart(unit, requests[e.request()], narrow);
    auto it = need_index[r].find(need.id);
    if (it != need_index[r].end() && plan.needs[r][it->second].region != need.region) {
      need = unit;  // two different parts with one id: receive the whole unit instead
      it = need_index[r].find(need.id);
      if (it != need_index[r].end() && plan.needs[r][it->second].region != need.region) {
        return absl::InternalError(absl::StrCat(where, ": rank ", r, " needs two regions of ",
                                                unit.id.key, " with one shard id"));
      }
    }
    int index;
    if (it == need_index[r].end()) {
      index = static_cast<int>(plan.needs[r].size());
      need_index[r].emplace(need.id, index);
      plan.needs[r].push_back(std::move(need));
      if (r == me) out->my_targets.emplace_back();
    } else {
      index = it->second;
    }
    if (r == me) out->my_targets[index].push_back(e.request());
  }
  return absl::OkStatus();
}

// Without `narrow`, the plan splits a piece larger than the budget into several units read by
// the rank chosen for the piece; a unit needed by one other rank only must still travel, so its
// reader counts as needing it too (it already holds it; nothing is scattered).
void AddReadersAsNeeding(const pb::LoadWaveEntry& wave, int me,
                         std::vector<std::map<PieceId, int, PieceIdLess>>& need_index,
                         WaveExchange* out) {
  ExchangePlan& plan = out->plan;
  std::vector<bool> delivered(plan.distribution.size(), false);
  for (const pb::LoadDeliveryEntry& e : wave.deliveries()) delivered[e.unit()] = true;
  for (int u = 0; u < static_cast<int>(plan.distribution.size()); ++u) {
    const DistributedPiece& d = plan.distribution[u];
    if (!delivered[u] || need_index[d.main_rank].count(d.spec.id) > 0) continue;
    need_index[d.main_rank].emplace(d.spec.id, static_cast<int>(plan.needs[d.main_rank].size()));
    plan.needs[d.main_rank].push_back(d.spec);
    if (d.main_rank == me) out->my_targets.emplace_back();
  }
}

}  // namespace

absl::StatusOr<std::vector<LoadRequest>> ResolveRequests(const pb::LoadPlanPart& part,
                                                         const TensorLookup& tensors,
                                                         const std::string& who) {
  std::vector<LoadRequest> requests;
  for (const pb::LoadRequestEntry& e : part.requests()) {
    LoadRequest q;
    q.rank = e.rank();
    q.key = e.key();
    q.local_index = e.local_index();
    absl::StatusOr<Region> region = RegionFromProto(e.region());
    const pb::TensorMeta* meta = tensors(e.key());
    if (!region.ok() || meta == nullptr || e.rank() < 0 || e.rank() >= part.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": the load plan's request of rank ",
                                                     e.rank(), " for ", e.key(),
                                                     " does not match checkpoint ", part.path()));
    }
    q.region = *std::move(region);
    q.shape.assign(meta->global_shape().begin(), meta->global_shape().end());
    absl::StatusOr<DType> dtype = DTypeFromProto(meta->dtype());
    if (!dtype.ok()) return dtype.status();
    q.dtype = *dtype;
    requests.push_back(std::move(q));
  }
  return requests;
}

PieceSpec NeededPart(const PieceSpec& unit, const LoadRequest& request, bool narrow) {
  if (!narrow) return unit;
  const Region& u = unit.region;
  const Region& q = request.region;
  if (!u.flat.has_value() && !q.flat.has_value()) {
    std::optional<Region> box = IntersectBoxes(u, q);
    if (!box.has_value()) return unit;
    PieceSpec s = unit;
    s.region = *box;
    s.id = PieceId{unit.id.key, box->offsets, std::nullopt};
    return s;
  }
  if (u.offsets == q.offsets && u.lengths == q.lengths) {
    const int64_t n = u.BoxElements();
    FlatRange uf = u.flat.value_or(FlatRange{0, n});
    FlatRange qf = q.flat.value_or(FlatRange{0, n});
    FlatRange f{std::max(uf.start, qf.start), std::min(uf.stop, qf.stop)};
    if (f.start >= f.stop) return unit;
    PieceSpec s = unit;
    if (f.start == 0 && f.stop == n) {
      s.region.flat.reset();
    } else {
      s.region.flat = f;
    }
    s.id = PieceId{unit.id.key, u.offsets, s.region.flat};
    return s;
  }
  return unit;
}

absl::Status CheckDeliveriesTileRequests(const pb::LoadPlanPart& part, const pb::Manifest& manifest,
                                         const std::vector<LoadRequest>& requests, int me,
                                         const std::string& who) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> written(requests.size());
  for (const pb::LoadWaveEntry& wave : part.waves()) {
    for (const pb::LoadDeliveryEntry& e : wave.deliveries()) {
      if (e.dst_rank() != me) continue;
      const pb::LoadUnitEntry* u =
          e.unit() >= 0 && e.unit() < wave.units_size() ? &wave.units(e.unit()) : nullptr;
      if (u == nullptr || e.request() < 0 || e.request() >= static_cast<int>(requests.size()) ||
          u->piece() < 0 || u->piece() >= manifest.pieces_size()) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": inconsistent delivery in the plan"));
      }
      absl::StatusOr<Region> unit = RegionFromProto(manifest.pieces(u->piece()).region());
      if (!unit.ok()) return unit.status();
      const int64_t n = unit->NumElements();
      if (u->first_element() < 0 || u->num_elements() <= 0 ||
          u->first_element() + u->num_elements() > n) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": a unit of the plan reads elements outside its piece"));
      }
      if (u->first_element() != 0 || u->num_elements() != n) {
        const int64_t base = unit->flat.has_value() ? unit->flat->start : 0;
        unit->flat =
            FlatRange{base + u->first_element(), base + u->first_element() + u->num_elements()};
      }
      const LoadRequest& q = requests[e.request()];
      absl::StatusOr<std::vector<CopyRun>> runs = OverlapRuns(*unit, q.region, q.shape);
      if (!runs.ok()) return runs.status();
      for (const CopyRun& r : *runs) written[e.request()].emplace_back(r.dst_offset, r.length);
    }
  }
  for (size_t q = 0; q < requests.size(); ++q) {
    if (requests[q].rank != me) continue;
    absl::Status s = RunTilingStatus(
        FindRunTilingFault(std::move(written[q]), requests[q].region.NumElements()),
        absl::StrCat("tensor ", requests[q].key, " ", requests[q].region.DebugString()));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(who, ": the load plan: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<WaveExchange> BuildWaveExchange(const pb::LoadWaveEntry& wave,
                                               const pb::Manifest& manifest,
                                               const TensorLookup& tensors,
                                               const std::vector<LoadRequest>& requests, int me,
                                               int world, bool narrow, const std::string& where) {
  WaveExchange out;
  out.plan.num_ranks = world;
  out.plan.needs.resize(world);
  for (const pb::LoadUnitEntry& u : wave.units()) {
    absl::StatusOr<DistributedPiece> d = UnitShard(u, manifest, tensors, world, where);
    if (!d.ok()) return d.status();
    if (u.reader() == me) {
      const int64_t elem = DTypeSize(d->spec.dtype);
      out.reads.push_back(UnitRead{u.piece(), u.first_element() * elem,
                                   (u.first_element() + u.num_elements()) * elem, d->spec.id});
    }
    out.plan.distribution.push_back(*std::move(d));
  }
  std::vector<std::map<PieceId, int, PieceIdLess>> need_index(world);
  if (absl::Status s = AddDeliveredNeeds(wave, requests, me, narrow, where, need_index, &out);
      !s.ok()) {
    return s;
  }
  if (!narrow) AddReadersAsNeeding(wave, me, need_index, &out);
  return out;
}

}  // namespace ckpt::worker
