#include "coordinator/plan_parts.h"

#include <algorithm>
#include <utility>

namespace ckpt::coordinator {
namespace {

// Whether `rank` is a valid index into per-rank lists of `whole`.
bool InWorld(const pb::LoadPlanPart& whole, int rank) {
  return rank >= 0 && rank < whole.world_size();
}

// Sorts and removes duplicates.
void SortUnique(std::vector<int>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

bool SplitsIntoOwnShares(pb::LoadAlgorithm algorithm) {
  return algorithm == pb::LOAD_BROADCAST || algorithm == pb::LOAD_GATHER_ROUNDS ||
         algorithm == pb::LOAD_GATHER_OBJECT || algorithm == pb::LOAD_OVERLAP_ALL_TO_ALL;
}

PlanSplitter::PlanSplitter(const pb::LoadPlanPart& whole)
    : whole_(whole),
      split_(SplitsIntoOwnShares(whole.algorithm())),
      narrow_(whole.algorithm() == pb::LOAD_OVERLAP_ALL_TO_ALL) {
  if (!split_) return;
  header_.CopyFrom(whole);
  header_.clear_requests();
  header_.clear_waves();
  header_.set_own_share(true);
  const int world = std::max(whole.world_size(), 0);
  requests_of_.resize(world);
  for (int q = 0; q < whole.requests_size(); ++q) {
    const int r = whole.requests(q).rank();
    if (InWorld(whole, r)) requests_of_[r].push_back(q);
  }
  waves_.resize(whole.waves_size());
  for (int w = 0; w < whole.waves_size(); ++w) {
    const pb::LoadWaveEntry& wave = whole.waves(w);
    WaveIndex& index = waves_[w];
    index.units_read_by.resize(world);
    index.deliveries_to.resize(world);
    index.deliveries_of.resize(wave.units_size());
    index.witness.assign(wave.units_size(), -1);
    index.reader_ordinal.assign(wave.units_size(), 0);
    for (int u = 0; u < wave.units_size(); ++u) {
      const int reader = wave.units(u).reader();
      if (!InWorld(whole, reader)) continue;
      index.reader_ordinal[u] = static_cast<int>(index.units_read_by[reader].size());
      index.units_read_by[reader].push_back(u);
    }
    for (int d = 0; d < wave.deliveries_size(); ++d) {
      const pb::LoadDeliveryEntry& e = wave.deliveries(d);
      if (e.unit() < 0 || e.unit() >= wave.units_size() || !InWorld(whole, e.dst_rank())) continue;
      index.deliveries_to[e.dst_rank()].push_back(d);
      index.deliveries_of[e.unit()].push_back(d);
      if (index.witness[e.unit()] < 0 && e.dst_rank() != wave.units(e.unit()).reader()) {
        index.witness[e.unit()] = d;
        index.exchanged.push_back(e.unit());
      }
    }
    SortUnique(index.exchanged);
  }
}

pb::LoadPlanPart PlanSplitter::ShareOf(int me) const {
  if (!split_ || !InWorld(whole_, me)) return whole_;
  pb::LoadPlanPart out = header_;  // not a copy of the whole plan per rank
  absl::flat_hash_map<int, int> request_index;
  for (int q : requests_of_[me]) {
    request_index.emplace(q, out.requests_size());
    *out.add_requests() = whole_.requests(q);
  }
  for (int w = 0; w < whole_.waves_size(); ++w) AddWaveShare(w, me, request_index, out);
  return out;
}

void PlanSplitter::AddWaveShare(int w, int me, absl::flat_hash_map<int, int>& request_index,
                                pb::LoadPlanPart& out) const {
  const pb::LoadWaveEntry& wave = whole_.waves(w);
  const WaveIndex& index = waves_[w];
  // Units: what `me` reads or receives, plus the algorithm's collective schedule.
  std::vector<int> received;
  for (int d : index.deliveries_to[me]) received.push_back(wave.deliveries(d).unit());
  SortUnique(received);
  std::vector<int> units;
  if (whole_.algorithm() == pb::LOAD_GATHER_ROUNDS) {
    units.resize(wave.units_size());
    for (int u = 0; u < wave.units_size(); ++u) units[u] = u;
  } else {
    units = index.units_read_by[me];
    units.insert(units.end(), received.begin(), received.end());
    if (whole_.algorithm() == pb::LOAD_BROADCAST) {
      units.insert(units.end(), index.exchanged.begin(), index.exchanged.end());
    }
    SortUnique(units);
  }
  // Deliveries: to `me`; overlap_all_to_all: of the units it reads (it cuts what it sends by
  // their requests); the others: witnesses that a unit is exchanged.
  std::vector<int> deliveries = index.deliveries_to[me];
  std::vector<int> witnesses;
  for (int u : units) {
    const int reader = wave.units(u).reader();
    if (narrow_) {
      if (reader == me) {
        deliveries.insert(deliveries.end(), index.deliveries_of[u].begin(),
                          index.deliveries_of[u].end());
      }
      continue;
    }
    const int witness = index.witness[u];
    if (witness < 0 || wave.deliveries(witness).dst_rank() == me) continue;
    // Broadcast: every rank must know the unit is broadcast; the others only its reader (who
    // counts as needing a unit it sends), unless `me` already receives it from another rank.
    const bool receives = std::binary_search(received.begin(), received.end(), u);
    if (reader == me || (whole_.algorithm() == pb::LOAD_BROADCAST && !receives)) {
      witnesses.push_back(witness);
    }
  }
  deliveries.insert(deliveries.end(), witnesses.begin(), witnesses.end());
  SortUnique(deliveries);
  SortUnique(witnesses);

  pb::LoadWaveEntry* share = out.add_waves();
  for (int u : units) {
    pb::LoadUnitEntry* e = share->add_units();
    *e = wave.units(u);
    e->set_reader_ordinal(index.reader_ordinal[u]);
  }
  for (int d : deliveries) {
    const pb::LoadDeliveryEntry& e = wave.deliveries(d);
    pb::LoadDeliveryEntry* copy = share->add_deliveries();
    copy->set_dst_rank(e.dst_rank());
    copy->set_unit(
        static_cast<int>(std::lower_bound(units.begin(), units.end(), e.unit()) - units.begin()));
    if (std::binary_search(witnesses.begin(), witnesses.end(), d)) {
      copy->set_request(-1);
      continue;
    }
    if (e.request() < 0 || e.request() >= whole_.requests_size()) {
      copy->set_request(-1);  // malformed: the worker refuses it naming the plan
      continue;
    }
    auto [it, added] = request_index.emplace(e.request(), out.requests_size());
    if (added) *out.add_requests() = whole_.requests(e.request());
    copy->set_request(it->second);
  }
}

}  // namespace ckpt::coordinator
