#include "worker/load_exchange_executor.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "exchange/communicator_factory.h"
#include "exchange/exchange.h"
#include "exchange/staging_arena.h"
#include "proto/convert.h"
#include "rendezvous/grpc_store.h"
#include "sharding/coverage.h"
#include "sharding/overlap.h"
#include "storage/checkpoint_reader.h"
#include "worker/load_executor.h"

namespace ckpt::worker {
namespace {

// A region some rank receives; `dest` is set for this rank's own requests.
struct Request {
  int rank = 0;
  std::string key;
  Region region;
  std::vector<int64_t> shape;
  DType dtype = DType::kU8;
  char* dest = nullptr;
};

// What a rank must receive of `unit` for `request`: for overlap_all_to_all only the part of
// the unit the request covers, when that part is itself a region (a box intersection of two
// plain boxes, or a flat intersection on one box); otherwise the whole unit.
ShardSpec NeededPart(const ShardSpec& unit, const Request& request, bool narrow) {
  if (!narrow) return unit;
  const Region& u = unit.region;
  const Region& q = request.region;
  if (!u.flat.has_value() && !q.flat.has_value()) {
    std::optional<Region> box = IntersectBoxes(u, q);
    if (!box.has_value()) return unit;
    ShardSpec s = unit;
    s.region = *box;
    s.id = ShardId{unit.id.key, box->offsets, std::nullopt};
    return s;
  }
  if (u.offsets == q.offsets && u.lengths == q.lengths) {
    const int64_t n = u.BoxElements();
    FlatRange uf = u.flat.value_or(FlatRange{0, n});
    FlatRange qf = q.flat.value_or(FlatRange{0, n});
    FlatRange f{std::max(uf.start, qf.start), std::min(uf.stop, qf.stop)};
    if (f.start >= f.stop) return unit;
    ShardSpec s = unit;
    if (f.start == 0 && f.stop == n) {
      s.region.flat.reset();
    } else {
      s.region.flat = f;
    }
    s.id = ShardId{unit.id.key, u.offsets, s.region.flat};
    return s;
  }
  return unit;
}

// Before anything is read, exchanged or scattered: the plan's deliveries to this rank's
// requests must write every element of each request exactly once, so the trainer's memory is
// never left with a hole of stale bytes (the coordinator planned them so, from a checkpoint
// whose pieces tile each tensor; this guards against a plan or checkpoint that does not).
absl::Status CheckDeliveriesTileRequests(const pb::LoadPlanPart& part, const pb::Manifest& manifest,
                                         const std::vector<Request>& requests, int me,
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
      const Request& q = requests[e.request()];
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

// The rendezvous store, with waits cut into short slices so that a part whose operation was
// aborted stops waiting for peers that will never arrive (instead of the rendezvous timeout).
class CancellableStore final : public Store {
 public:
  CancellableStore(Store* base, const MemoryGate* gate) : base_(base), gate_(gate) {}

  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override {
    return base_->Set(key, value, deadline);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) override {
    return base_->Add(key, delta, deadline);
  }
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override {
    while (true) {
      if (absl::Status closed = gate_->status(); !closed.ok()) return closed;
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(250));
      absl::StatusOr<std::vector<std::string>> got = base_->Get(keys, slice);
      if (got.ok() || got.status().code() != absl::StatusCode::kDeadlineExceeded ||
          slice >= deadline) {
        return got;
      }
    }
  }

 private:
  Store* base_;
  const MemoryGate* gate_;
};

}  // namespace

absl::Status ExecuteExchangeLoadPart(const pb::LoadPlanPart& part, const SessionInfo& session,
                                     const ExchangeLoadContext& context, MemoryGate& gate,
                                     ExchangeLoadStats* stats,
                                     const std::function<void(int64_t bytes_done)>& progress,
                                     PinnedStagingPool* device_staging) {
  ExchangeLoadStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = ExchangeLoadStats();
  const int me = part.rank();
  const int world = part.world_size();
  const std::string who = absl::StrCat("rank ", me, " of job ", session.trainer.job);
  if (me != session.trainer.rank) {
    return absl::InternalError(absl::StrCat("load plan part of rank ", me, " delivered for rank ",
                                            session.trainer.rank, " of job ", session.trainer.job));
  }
  if (world <= 0 || me >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": load plan part names world size ", world));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(part.path());
  if (!reader.ok()) {
    return absl::Status(
        reader.status().code(),
        absl::StrCat(who, ": opening checkpoint ", part.path(), ": ", reader.status().message()));
  }
  const pb::Manifest& manifest = (*reader)->manifest();

  // Every rank's requests; this rank's point into the trainer's shared tensors (or, for device
  // tensors, into a host buffer copied onto the device at the end).
  std::vector<Request> requests;
  std::vector<std::pair<const RegisteredTensor*, std::unique_ptr<char[]>>> device_shadows;
  for (const pb::LoadRequestEntry& e : part.requests()) {
    Request q;
    q.rank = e.rank();
    q.key = e.key();
    absl::StatusOr<Region> region = RegionFromProto(e.region());
    const pb::TensorMeta* meta = (*reader)->FindTensor(e.key());
    if (!region.ok() || meta == nullptr || e.rank() < 0 || e.rank() >= world) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": the load plan's request of rank ",
                                                     e.rank(), " for ", e.key(),
                                                     " does not match checkpoint ", part.path()));
    }
    q.region = *std::move(region);
    q.shape.assign(meta->global_shape().begin(), meta->global_shape().end());
    absl::StatusOr<DType> dtype = DTypeFromProto(meta->dtype());
    if (!dtype.ok()) return dtype.status();
    q.dtype = *dtype;
    if (q.rank == me) {
      if (e.local_index() < 0 || e.local_index() >= static_cast<int>(session.tensors.size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": tensor ", e.key(), " (local index ", e.local_index(), ") is not among the ",
            session.tensors.size(),
            " tensors the trainer shares now (did it re-register its state during the load?)"));
      }
      const RegisteredTensor& t = session.tensors[e.local_index()];
      absl::StatusOr<Region> shared = RegionFromProto(t.shard.region());
      if (!shared.ok() || t.shard.tensor().key() != e.key() || *shared != q.region ||
          t.nbytes != q.region.NumElements() * DTypeSize(q.dtype)) {
        return absl::FailedPreconditionError(
            absl::StrCat(who, ": the plan's read of ", e.key(), " ", q.region.DebugString(),
                         " does not match the shared tensor ", t.shard.tensor().key()));
      }
      if (t.memory_kind == "device") {
        if (device_staging == nullptr) {
          return absl::FailedPreconditionError(
              absl::StrCat(who, ": tensor ", e.key(), " is in device memory (device ", t.device,
                           ") but this worker has no device staging (it serves no GPU)"));
        }
        device_shadows.emplace_back(&t, new char[std::max<int64_t>(t.nbytes, 1)]);
        q.dest = device_shadows.back().second.get();
      } else if (t.memory_kind != "host" || (t.data == nullptr && t.nbytes > 0)) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": tensor ", e.key(), " is in ", t.memory_kind, " memory not mapped here"));
      } else {
        q.dest = reinterpret_cast<char*>(t.data);
      }
    }
    requests.push_back(std::move(q));
  }

  CKPT_RETURN_IF_ERROR(CheckDeliveriesTileRequests(part, manifest, requests, me, who));

  // The operation's communicator.
  GrpcStore grpc_store(context.rendezvous_address, context.rendezvous_security);
  CancellableStore store(&grpc_store, &gate);
  CommunicatorOptions comm_options;
  comm_options.memory_kind = MemoryKind::kHost;
  comm_options.group_name = part.group();
  comm_options.hostname = context.hostname;
  comm_options.gloo_loop_thread_nice = context.gloo_loop_thread_nice;
  const absl::Time rendezvous_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(&store, me, world, comm_options, absl::Now() + context.rendezvous_timeout);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat(who, ": joining the load's communicator (group ", part.group(),
                                     ", ", world, " ranks, rendezvous at ",
                                     context.rendezvous_address, "): ", comm.status().message()));
  }
  stats->rendezvous_time = absl::Now() - rendezvous_start;
  ExchangeOptions exchange_options;
  if (part.memory_budget_bytes() > 0) {
    exchange_options.memory_budget_bytes = part.memory_budget_bytes();
  }
  exchange_options.deadline = absl::Now() + context.exchange_timeout;
  // One staging block for every wave, so its pages are mapped once per part, not per wave.
  StagingArena staging;
  exchange_options.staging = &staging;
  const bool narrow = part.algorithm() == "overlap_all_to_all";

  for (int w = 0; w < part.waves_size(); ++w) {
    const pb::LoadWaveEntry& wave = part.waves(w);
    const std::string where =
        absl::StrCat(who, ": wave ", w + 1, " of ", part.waves_size(), " (", part.algorithm(), ")");
    if (absl::Status closed = gate.status(); !closed.ok()) {
      return absl::Status(closed.code(), absl::StrCat(where, ": ", closed.message()));
    }
    // The wave's units as shards of the exchange plan.
    ExchangePlan plan;
    plan.num_ranks = world;
    plan.needs.resize(world);
    std::vector<PieceRead> reads;
    ShardBuffers loaded;
    for (const pb::LoadUnitEntry& u : wave.units()) {
      if (u.piece() < 0 || u.piece() >= manifest.pieces_size() || u.reader() < 0 ||
          u.reader() >= world) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unit names piece ", u.piece(), " read by rank ", u.reader()));
      }
      const pb::StoredPiece& piece = manifest.pieces(u.piece());
      const pb::TensorMeta* meta = (*reader)->FindTensor(piece.key());
      absl::StatusOr<Region> region = RegionFromProto(piece.region());
      absl::StatusOr<DType> dtype = meta == nullptr
                                        ? absl::StatusOr<DType>(absl::NotFoundError(piece.key()))
                                        : DTypeFromProto(meta->dtype());
      if (!region.ok() || !dtype.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": stored piece of ", piece.key(),
                                                       " in ", piece.file(),
                                                       " is not readable from the manifest"));
      }
      const int64_t n = region->NumElements();
      if (u.first_element() < 0 || u.num_elements() <= 0 ||
          u.first_element() + u.num_elements() > n) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unit of ", piece.key(), " reads elements outside its piece"));
      }
      DistributedShard d;
      d.main_rank = u.reader();
      d.spec.dtype = *dtype;
      d.spec.global_shape.assign(meta->global_shape().begin(), meta->global_shape().end());
      d.spec.region = *region;
      if (u.first_element() != 0 || u.num_elements() != n) {
        const int64_t base = region->flat.has_value() ? region->flat->start : 0;
        d.spec.region.flat =
            FlatRange{base + u.first_element(), base + u.first_element() + u.num_elements()};
      }
      d.spec.id = ShardId{piece.key(), region->offsets, d.spec.region.flat};
      if (u.reader() == me) {
        const int64_t elem = DTypeSize(*dtype);
        std::string& buffer = loaded[d.spec.id];
        buffer.resize(u.num_elements() * elem);
        reads.push_back(PieceRead{u.piece(), u.first_element() * elem,
                                  (u.first_element() + u.num_elements()) * elem, buffer.data()});
        stats->bytes_read += static_cast<int64_t>(buffer.size());
      }
      plan.distribution.push_back(std::move(d));
    }
    // What each rank receives, and which of this rank's requests each of its needs feeds.
    std::vector<std::map<ShardId, int, ShardIdLess>> need_index(world);
    std::vector<std::vector<int>> my_targets;
    for (const pb::LoadDeliveryEntry& e : wave.deliveries()) {
      if (e.unit() < 0 || e.unit() >= static_cast<int>(plan.distribution.size()) ||
          e.request() < 0 || e.request() >= static_cast<int>(requests.size()) ||
          requests[e.request()].rank != e.dst_rank()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": inconsistent delivery"));
      }
      const ShardSpec& unit = plan.distribution[e.unit()].spec;
      const int r = e.dst_rank();
      ShardSpec need = NeededPart(unit, requests[e.request()], narrow);
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
        if (r == me) my_targets.emplace_back();
      } else {
        index = it->second;
      }
      if (r == me) my_targets[index].push_back(e.request());
    }
    if (!narrow) {
      // The plan splits a piece larger than the budget into several units read by the rank
      // chosen for the piece; a unit needed by one other rank only must still travel, so its
      // reader counts as needing it too (it already holds it; nothing is scattered).
      std::vector<bool> delivered(plan.distribution.size(), false);
      for (const pb::LoadDeliveryEntry& e : wave.deliveries()) delivered[e.unit()] = true;
      for (int u = 0; u < static_cast<int>(plan.distribution.size()); ++u) {
        const DistributedShard& d = plan.distribution[u];
        if (!delivered[u] || need_index[d.main_rank].count(d.spec.id) > 0) continue;
        need_index[d.main_rank].emplace(d.spec.id,
                                        static_cast<int>(plan.needs[d.main_rank].size()));
        plan.needs[d.main_rank].push_back(d.spec);
        if (d.main_rank == me) my_targets.emplace_back();
      }
    }
    absl::Time step_start = absl::Now();
    if (!reads.empty()) {
      absl::Status s = (*reader)->ReadPieces(reads);
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(where, ": reading from ", part.path(), ": ", s.message()));
      }
    }
    stats->read_time += absl::Now() - step_start;
    step_start = absl::Now();
    ExchangeReport report;
    absl::StatusOr<ShardBuffers> received =
        ExchangeByDistribution(part.algorithm(), **comm, plan, loaded, exchange_options, &report);
    if (!received.ok()) {
      return absl::Status(received.status().code(),
                          absl::StrCat(where, ": exchange failed: ", received.status().message()));
    }
    stats->bytes_sent += report.bytes_sent();
    stats->bytes_received += report.bytes_received();
    loaded.clear();
    stats->exchange_time += absl::Now() - step_start;
    step_start = absl::Now();
    // Scatter into the trainer's tensors.
    for (int i = 0; i < static_cast<int>(plan.needs[me].size()); ++i) {
      const ShardSpec& need = plan.needs[me][i];
      auto buffer = received->find(need.id);
      if (buffer == received->end()) {
        return absl::InternalError(
            absl::StrCat(where, ": the exchange did not deliver ", need.id.DebugString()));
      }
      for (int q : my_targets[i]) {
        const Request& request = requests[q];
        absl::StatusOr<std::vector<CopyRun>> runs =
            OverlapRuns(need.region, request.region, request.shape);
        if (!runs.ok()) {
          return absl::Status(
              runs.status().code(),
              absl::StrCat(where, ": scattering ", request.key, ": ", runs.status().message()));
        }
        const int64_t elem = DTypeSize(request.dtype);
        absl::Status copied = gate.CopyRuns(*runs, elem, buffer->second.data(), request.dest);
        if (!copied.ok()) {
          return absl::Status(copied.code(), absl::StrCat(where, ": stopped scattering ",
                                                          request.key, ": ", copied.message()));
        }
        for (const CopyRun& run : *runs) stats->bytes_scattered += run.length * elem;
      }
    }
    stats->scatter_time += absl::Now() - step_start;
    if (progress) progress(stats->bytes_scattered);
  }
  // Device tensors: every wave has been scattered into their host buffers; onto the device now.
  const absl::Time device_start = absl::Now();
  for (const auto& [tensor, shadow] : device_shadows) {
    absl::Status s = CopyOntoDevice(*tensor, shadow.get(), device_staging, gate, who);
    if (!s.ok()) return s;
  }
  stats->scatter_time += absl::Now() - device_start;
  return absl::OkStatus();
}

}  // namespace ckpt::worker
