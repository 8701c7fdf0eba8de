#include "coordinator/load_exchange.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/load_direct.h"
#include "planner/load_plan.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "proto/wire_names.h"
#include "storage/checkpoint_reader.h"

namespace ckpt::coordinator {

namespace {

// The planner's algorithm for an exchange-based load; InvalidArgument for direct/auto/unset
// (resolved before) or a value this build does not know.
absl::StatusOr<ExchangeAlgorithm> PlannerAlgorithm(pb::LoadAlgorithm algorithm) {
  switch (algorithm) {
    case pb::LOAD_BROADCAST:
      return ExchangeAlgorithm::kBroadcast;
    case pb::LOAD_OVERLAP_ALL_TO_ALL:
      return ExchangeAlgorithm::kOverlapAllToAll;
    case pb::LOAD_GATHER_ROUNDS:
      return ExchangeAlgorithm::kGatherRounds;
    case pb::LOAD_GATHER_OBJECT:
      return ExchangeAlgorithm::kGatherObject;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown load exchange algorithm ", static_cast<int>(algorithm),
                       "; valid: ", absl::StrJoin(LoadAlgorithmNames(), ", ")));
  }
}

// What the load planner needs of a checkpoint: its tensors and stored pieces.
struct StoredCheckpoint {
  std::vector<TensorMeta> tensors;
  std::vector<StoredPieceInfo> pieces;
};

// The planner's view of `manifest` (of the checkpoint at `path`); errors name the checkpoint
// and the tensor or piece.
absl::StatusOr<StoredCheckpoint> ReadStoredCheckpoint(const std::string& path,
                                                      const pb::Manifest& manifest) {
  StoredCheckpoint stored;
  for (const pb::TensorMeta& t : manifest.tensors()) {
    TensorMeta c;
    c.key = t.key();
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, " tensor ", t.key(), ": ", dtype.status().message()));
    }
    c.dtype = *dtype;
    c.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
    stored.tensors.push_back(std::move(c));
  }
  for (const pb::StoredPiece& p : manifest.pieces()) {
    StoredPieceInfo info;
    info.key = p.key();
    absl::StatusOr<Region> region = RegionFromProto(p.region());
    if (!region.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, " piece of ", p.key(),
                                                     " in ", p.file(), ": ",
                                                     region.status().message()));
    }
    info.region = *std::move(region);
    info.file = p.file();
    info.byte_offset = p.byte_offset();
    info.byte_length = p.byte_length();
    stored.pieces.push_back(std::move(info));
  }
  return stored;
}

// The planner's requests: every non-empty read of the direct plan's parts, each also recorded
// in the part shared by all ranks.
absl::StatusOr<std::vector<LoadRequest>> CollectRequests(const std::vector<pb::LoadPlanPart>& parts,
                                                         pb::LoadPlanPart* shared) {
  std::vector<LoadRequest> requests;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r) {
    for (const pb::LoadRead& read : parts[r].reads()) {
      if (read.size_bytes() == 0) continue;  // nothing to move
      LoadRequest q;
      q.rank = r;
      q.key = read.key();
      absl::StatusOr<Region> region = RegionFromProto(read.region());
      if (!region.ok()) return region.status();
      q.region = *std::move(region);
      requests.push_back(std::move(q));
      pb::LoadRequestEntry* e = shared->add_requests();
      e->set_rank(r);
      e->set_key(read.key());
      *e->mutable_region() = read.region();
      e->set_local_index(read.local_index());
    }
  }
  return requests;
}

// Records the plan's waves (read units and deliveries) in the shared part.
void AddWaves(const LoadPlan& plan, pb::LoadPlanPart* shared) {
  for (const LoadWave& wave : plan.waves) {
    pb::LoadWaveEntry* w = shared->add_waves();
    for (const ReadUnit& u : wave.units) {
      pb::LoadUnitEntry* e = w->add_units();
      e->set_piece(static_cast<int32_t>(u.piece));
      e->set_reader(static_cast<int32_t>(u.reader));
      e->set_first_element(u.first_element);
      e->set_num_elements(u.num_elements);
    }
    for (const Delivery& d : wave.deliveries) {
      pb::LoadDeliveryEntry* e = w->add_deliveries();
      e->set_unit(static_cast<int32_t>(d.unit));
      e->set_request(static_cast<int32_t>(d.request));
      e->set_dst_rank(static_cast<int32_t>(d.dst_rank));
    }
  }
}

}  // namespace

ExchangeTransport ChooseExchangeTransport(const Operation& op) {
  std::map<std::pair<std::string, int>, int> rank_on_gpu;  // (host, gpu) -> first rank on it
  int64_t device_shards = 0;
  for (int r = 0; r < static_cast<int>(op.ranks.size()); ++r) {
    const RankEntry& e = op.ranks[r];
    if (e.memory_kinds.size() != e.shards.size()) {
      return {false, absl::StrCat("rank ", r, " did not say where its tensors live")};
    }
    for (size_t i = 0; i < e.shards.size(); ++i) {
      if (e.memory_kinds[i] != pb::MEMORY_DEVICE) {
        return {false,
                absl::StrCat("rank ", r, " has tensors in ", MemoryKindName(e.memory_kinds[i]),
                             " memory (", e.shards[i].tensor().key(), ")")};
      }
    }
    device_shards += static_cast<int64_t>(e.shards.size());
    if (!e.location.nccl || e.location.gpu < 0) {
      return {false, absl::StrCat("the worker of rank ", r, " (", e.location.DebugString(),
                                  ") cannot create an NCCL communicator")};
    }
    auto [first, inserted] =
        rank_on_gpu.emplace(std::make_pair(e.location.host, e.location.gpu), r);
    if (!inserted) {
      return {false, absl::StrCat("ranks ", first->second, " and ", r, " share GPU ",
                                  e.location.gpu, " of host ", e.location.host,
                                  " (NCCL refuses two ranks on one device)")};
    }
  }
  if (device_shards == 0) return {false, "no rank has device tensors"};
  return {true, "every rank is device-resident on its own GPU with NCCL"};
}

pb::LoadAlgorithm AutoLoadAlgorithm(const Operation& op) {
  for (const RankEntry& e : op.ranks) {
    if (e.location.host != op.ranks.front().location.host) return pb::LOAD_BROADCAST;
  }
  return pb::LOAD_DIRECT;
}

absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoad(const Operation& op,
                                                       const LoadPlannerOptions& options) {
  pb::LoadAlgorithm algorithm =
      options.algorithm == pb::LOAD_ALGORITHM_UNSPECIFIED ? pb::LOAD_BROADCAST : options.algorithm;
  if (algorithm == pb::LOAD_AUTO) algorithm = AutoLoadAlgorithm(op);
  if (algorithm == pb::LOAD_DIRECT) return PlanDirectLoad(op);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(op.path);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(), absl::StrCat("cannot load checkpoint ", op.path,
                                                             ": ", reader.status().message()));
  }
  LoadPlannerOptions resolved = options;
  resolved.algorithm = algorithm;
  return PlanExchangeLoadFrom(op, resolved, (*reader)->manifest(), {});
}

absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoadFrom(
    const Operation& op, const LoadPlannerOptions& options, const pb::Manifest& manifest,
    std::vector<std::vector<int64_t>> readers_of_piece) {
  const pb::LoadAlgorithm algorithm = options.algorithm;
  absl::StatusOr<ExchangeAlgorithm> planner_algorithm = PlannerAlgorithm(algorithm);
  if (!planner_algorithm.ok()) return planner_algorithm.status();
  // The direct plan validates every request against the checkpoint and carries each rank's
  // reads (tensor, region, local index); the exchange fields are added to it.
  absl::StatusOr<std::vector<RankPlan>> direct = PlanDirectLoadFrom(op, manifest);
  if (!direct.ok()) return direct.status();
  absl::StatusOr<StoredCheckpoint> stored = ReadStoredCheckpoint(op.path, manifest);
  if (!stored.ok()) return stored.status();
  std::vector<pb::LoadPlanPart> parts(op.world_size);
  for (int r = 0; r < op.world_size; ++r) {
    if (!parts[r].ParseFromString((*direct)[r].part)) {
      return absl::InternalError("direct load plan part does not parse");
    }
  }
  pb::LoadPlanPart shared;
  absl::StatusOr<std::vector<LoadRequest>> requests = CollectRequests(parts, &shared);
  if (!requests.ok()) return requests.status();
  LoadPlanOptions plan_options;
  plan_options.algorithm = *planner_algorithm;
  plan_options.memory_budget_bytes = options.memory_budget_bytes;
  plan_options.readers_of_piece = std::move(readers_of_piece);
  absl::StatusOr<LoadPlan> plan =
      BuildLoadPlan(stored->tensors, stored->pieces, *requests, op.world_size, plan_options);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("planning the load of ", op.path, ": ",
                                                           plan.status().message()));
  }
  AddWaves(*plan, &shared);
  shared.set_algorithm(algorithm);
  shared.set_memory_budget_bytes(options.memory_budget_bytes);
  shared.set_world_size(op.world_size);
  shared.set_group(absl::StrCat("load/", op.id));
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  shared.set_device_exchange(transport.device);
  shared.set_transport_reason(transport.reason);
  std::vector<RankPlan> out(op.world_size);
  for (int r = 0; r < op.world_size; ++r) {
    parts[r].MergeFrom(shared);
    out[r].bytes = parts[r].total_bytes();
    out[r].part = parts[r].SerializeAsString();
  }
  return out;
}

LoadPlannerOptions ExchangeLoadKind::OptionsFor(const Operation& op) const {
  LoadPlannerOptions options = defaults_;
  if (op.load_algorithm != pb::LOAD_ALGORITHM_UNSPECIFIED) options.algorithm = op.load_algorithm;
  if (op.load_memory_budget_bytes > 0) options.memory_budget_bytes = op.load_memory_budget_bytes;
  return options;
}

absl::StatusOr<std::vector<RankPlan>> ExchangeLoadKind::Plan(const Operation& op) {
  return PlanExchangeLoad(op, OptionsFor(op));
}

absl::Status ExchangeLoadKind::Commit(const Operation& op) {
  return absl::FailedPreconditionError(
      absl::StrCat(op.DebugString(), ": a load has nothing to commit"));
}

}  // namespace ckpt::coordinator
