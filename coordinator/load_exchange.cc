#include "coordinator/load_exchange.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/group_plan.h"
#include "coordinator/load_direct.h"
#include "coordinator/plan_parts.h"
#include "planner/load_plan.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "proto/wire_names.h"

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

// The planner's view of `piece`, a validated stored piece of the checkpoint at `path`.
absl::StatusOr<StoredPieceInfo> StoredPieceInfoOf(const std::string& path,
                                                  const pb::StoredPiece& p) {
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
  return info;
}

// The planner's view of the tensors of `manifest` (of the checkpoint at `path`; its head will
// do), into `stored`; errors name the checkpoint and the tensor.
absl::Status ReadStoredTensors(const std::string& path, const pb::Manifest& manifest,
                               StoredCheckpoint* stored) {
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
    stored->tensors.push_back(std::move(c));
  }
  return absl::OkStatus();
}

// Whether rank `rank` of `op` holds the shard of `read` as its main replica.
bool ReadsMainReplica(const Operation& op, int rank, const pb::LoadRead& read) {
  const RankPieces& shards = op.ranks[rank].shards;
  if (read.local_index() < 0 || read.local_index() >= shards.size()) return true;
  return shards.is_main_replica(read.local_index());
}

// The planner's requests of the ranks `members` (one group; rank i of the group is
// members[i], its number in the requests): every non-empty read of their direct plan parts,
// each also recorded in the part shared by the group's ranks.
absl::StatusOr<std::vector<LoadRequest>> CollectRequests(const Operation& op,
                                                         const std::vector<pb::LoadPlanPart>& parts,
                                                         const std::vector<int64_t>& members,
                                                         pb::LoadPlanPart* shared) {
  std::vector<LoadRequest> requests;
  for (int i = 0; i < static_cast<int>(members.size()); ++i) {
    const int r = static_cast<int>(members[i]);
    for (const pb::LoadRead& read : parts[r].reads()) {
      if (read.size_bytes() == 0) continue;  // nothing to move
      LoadRequest q;
      q.rank = i;
      q.key = read.key();
      absl::StatusOr<Region> region = RegionFromProto(read.region());
      if (!region.ok()) return region.status();
      q.region = *std::move(region);
      q.main_replica = ReadsMainReplica(op, r, read);
      requests.push_back(std::move(q));
      pb::LoadRequestEntry* e = shared->add_requests();
      e->set_rank(i);
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

// What planning one group of an exchange-based load needs.
struct GroupLoadContext {
  const Operation& op;
  const LoadPlannerOptions& options;
  ExchangeAlgorithm algorithm;
  const StoredCheckpoint& stored;
  const std::vector<pb::LoadPlanPart>& parts;  // the direct plan, by rank
  const std::vector<std::vector<int64_t>>& readers_of_piece;
  const ExchangeTransport& transport;
  const LoadGroupChoice& groups;
  // Loads from storage: each part gets its manifest share from it (AttachShare); the stored
  // pieces above are the builder's kept pieces, by kept id. Null: memory-tier parts, whose
  // units index the whole manifest.
  const ManifestShareBuilder* shares;
  std::vector<int32_t>* scratch;  // with `shares`: AttachShare's, one entry per stored piece
};

// Gives `part` (group rank `me`'s) its manifest share: the stored pieces of the units `me`
// reads, then those of its other units as unread pieces, and renumbers the units' pieces from
// the builder's kept ids to the share's (proto/manifest.proto ManifestShare.unread_pieces).
// `scratch` has an entry per kept piece, all -1, and is left so: the cost is the part's units.
void AttachShare(const ManifestShareBuilder& shares, int me, pb::LoadPlanPart& part,
                 std::vector<int32_t>& scratch) {
  // scratch[piece]: 1 when `me` reads a unit of it, else 0; then its number in the share.
  std::vector<int32_t> touched;
  for (const pb::LoadWaveEntry& wave : part.waves()) {
    for (const pb::LoadUnitEntry& u : wave.units()) {
      int32_t& state = scratch[u.piece()];  // still the manifest's numbering here
      if (state < 0) touched.push_back(u.piece());
      state = std::max(state, u.reader() == me ? 1 : 0);
    }
  }
  std::vector<int32_t> read, unread;
  for (int32_t piece : touched) (scratch[piece] == 1 ? read : unread).push_back(piece);
  std::sort(read.begin(), read.end());
  std::sort(unread.begin(), unread.end());
  for (size_t i = 0; i < read.size(); ++i) scratch[read[i]] = static_cast<int32_t>(i);
  for (size_t i = 0; i < unread.size(); ++i) {
    scratch[unread[i]] = static_cast<int32_t>(read.size() + i);
  }
  for (pb::LoadWaveEntry& wave : *part.mutable_waves()) {
    for (pb::LoadUnitEntry& u : *wave.mutable_units()) {
      u.set_share_piece(scratch[u.piece()]);
      u.set_piece(-1);  // a worker that predates shares refuses the unit
    }
  }
  for (int32_t piece : touched) scratch[piece] = -1;
  std::vector<std::string> keys;
  for (const pb::LoadRequestEntry& q : part.requests()) keys.push_back(q.key());
  part.set_manifest_share(shares.ShareOfPieces(read, unread, keys));
}

// The ranks of `readers` (one list per piece, global ranks) within `members`, as group ranks;
// empty stays empty (no restriction).
std::vector<std::vector<int64_t>> ReadersInGroup(const std::vector<std::vector<int64_t>>& readers,
                                                 const std::vector<int64_t>& members) {
  std::vector<std::vector<int64_t>> out(readers.size());
  for (size_t p = 0; p < readers.size(); ++p) {
    for (int64_t r : readers[p]) {
      auto it = std::lower_bound(members.begin(), members.end(), r);
      if (it != members.end() && *it == r) out[p].push_back(it - members.begin());
    }
  }
  return out;
}

// Plans group `g` of the load (Megatron's ignore_groups: the group reads from storage every
// piece its ranks need, the pieces whose main replica is in another group last, and exchanges
// only among its ranks) into the parts of its ranks in `out`.
absl::Status PlanGroupLoad(const GroupLoadContext& c, size_t g, std::vector<RankPlan>* out) {
  const std::vector<int64_t>& members = c.groups.groups[g];
  const bool several = c.groups.groups.size() > 1;
  pb::LoadPlanPart shared;
  absl::StatusOr<std::vector<LoadRequest>> requests =
      CollectRequests(c.op, c.parts, members, &shared);
  if (!requests.ok()) return requests.status();
  LoadPlanOptions plan_options;
  plan_options.algorithm = c.algorithm;
  plan_options.memory_budget_bytes = c.options.memory_budget_bytes;
  plan_options.readers_of_piece = ReadersInGroup(c.readers_of_piece, members);
  absl::StatusOr<LoadPlan> plan = BuildLoadPlan(c.stored.tensors, c.stored.pieces, *requests,
                                                static_cast<int64_t>(members.size()), plan_options);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("planning the load of ", c.op.path,
                                     several ? absl::StrCat(" in process group ", g) : "", ": ",
                                     plan.status().message()));
  }
  AddWaves(*plan, &shared);
  shared.set_algorithm(c.options.algorithm);
  shared.set_memory_budget_bytes(c.options.memory_budget_bytes);
  shared.set_world_size(static_cast<int32_t>(members.size()));
  shared.set_group(several ? absl::StrCat("load/", c.op.id, "/g", g)
                           : absl::StrCat("load/", c.op.id));
  shared.set_device_exchange(c.transport.device);
  shared.set_transport_reason(c.groups.reason.empty()
                                  ? c.transport.reason
                                  : absl::StrCat(c.transport.reason, "; ", c.groups.reason));
  if (several) {
    shared.set_group_index(static_cast<int32_t>(g));
    for (int64_t r : members) shared.add_group_ranks(static_cast<int32_t>(r));
  }
  // Each rank gets only its own share of the group's plan (coordinator/plan_parts.h).
  const PlanSplitter splitter(shared);
  for (size_t i = 0; i < members.size(); ++i) {
    pb::LoadPlanPart part = c.parts[members[i]];
    part.MergeFrom(c.options.own_shares ? splitter.ShareOf(static_cast<int>(i)) : shared);
    if (several) part.set_group_rank(static_cast<int32_t>(i));
    if (c.shares != nullptr) AttachShare(*c.shares, static_cast<int>(i), part, *c.scratch);
    (*out)[members[i]].bytes = part.total_bytes();
    (*out)[members[i]].part = part.SerializeAsString();
  }
  return absl::OkStatus();
}

// The exchange-based plan of `op` over `stored` (the tensors of `head`, a manifest or its head,
// and the pieces the units will index), with each part's manifest share from `shares` when set.
absl::StatusOr<std::vector<RankPlan>> PlanExchangeParts(
    const Operation& op, const LoadPlannerOptions& options, const pb::Manifest& head,
    const StoredCheckpoint& stored, const std::vector<std::vector<int64_t>>& readers_of_piece,
    const ManifestShareBuilder* shares) {
  CKPT_ASSIGN_OR_RETURN(ExchangeAlgorithm planner_algorithm, PlannerAlgorithm(options.algorithm));
  // The direct plan validates every request against the checkpoint and carries each rank's
  // reads (tensor, region, local index); the exchange fields are added to it.
  CKPT_ASSIGN_OR_RETURN(std::vector<RankPlan> direct, PlanDirectLoadFrom(op, head));
  std::vector<pb::LoadPlanPart> parts(op.world_size);
  for (int r = 0; r < op.world_size; ++r) {
    if (!parts[r].ParseFromString(direct[r].part.Bytes())) {
      return absl::InternalError("direct load plan part does not parse");
    }
  }
  CKPT_ASSIGN_OR_RETURN(LoadGroupChoice groups, ChooseLoadGroups(op, options.auto_chosen));
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  std::vector<RankPlan> out(op.world_size);
  std::vector<int32_t> scratch(shares != nullptr ? stored.pieces.size() : 0, -1);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    GroupLoadContext context{op,     options,          planner_algorithm, stored,
                             parts,  readers_of_piece, transport,         groups,
                             shares, &scratch};
    CKPT_RETURN_IF_ERROR(PlanGroupLoad(context, g, &out));
  }
  return out;
}

}  // namespace

ExchangeTransport ChooseExchangeTransport(const Operation& op) {
  std::map<std::pair<std::string, int>, int> rank_on_gpu;  // (host, gpu) -> first rank on it
  int64_t device_shards = 0;
  for (int r = 0; r < static_cast<int>(op.ranks.size()); ++r) {
    const RankEntry& e = op.ranks[r];
    if (e.memory_kinds.size() != static_cast<size_t>(e.shards.size())) {
      return {false, absl::StrCat("rank ", r, " did not say where its tensors live")};
    }
    for (int i = 0; i < e.shards.size(); ++i) {
      if (e.memory_kinds[i] != pb::MEMORY_DEVICE) {
        return {false,
                absl::StrCat("rank ", r, " has tensors in ", MemoryKindName(e.memory_kinds[i]),
                             " memory (", e.shards.tensor(i).key(), ")")};
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
  CKPT_RETURN_IF_ERROR(PlannerAlgorithm(algorithm).status());
  LoadPlannerOptions resolved = options;
  resolved.algorithm = algorithm;
  resolved.auto_chosen = options.algorithm == pb::LOAD_AUTO;
  // The manifest streams past once; the planner keeps only the pieces some rank's read
  // overlaps, as StoredPieceInfo (no parsed manifest is held).
  StoredCheckpoint stored;
  absl::Status piece_error;
  auto keep = [&](const pb::StoredPiece& p) {
    absl::StatusOr<StoredPieceInfo> info = StoredPieceInfoOf(op.path, p);
    if (!info.ok()) {
      if (piece_error.ok()) piece_error = info.status();
      return;
    }
    stored.pieces.push_back(*std::move(info));
  };
  CKPT_ASSIGN_OR_RETURN(StreamedLoad streamed, StreamLoad(op, keep));
  CKPT_RETURN_IF_ERROR(piece_error);
  CKPT_RETURN_IF_ERROR(ReadStoredTensors(op.path, streamed.head, &stored));
  return PlanExchangeParts(op, resolved, streamed.head, stored, {}, streamed.shares.get());
}

absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoadFrom(
    const Operation& op, const LoadPlannerOptions& options, const pb::Manifest& manifest,
    std::vector<std::vector<int64_t>> readers_of_piece) {
  StoredCheckpoint stored;
  CKPT_RETURN_IF_ERROR(ReadStoredTensors(op.path, manifest, &stored));
  for (const pb::StoredPiece& p : manifest.pieces()) {
    CKPT_ASSIGN_OR_RETURN(StoredPieceInfo info, StoredPieceInfoOf(op.path, p));
    stored.pieces.push_back(std::move(info));
  }
  return PlanExchangeParts(op, options, manifest, stored, readers_of_piece, nullptr);
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

absl::Status ExchangeLoadKind::Commit(Operation& op) {
  return absl::FailedPreconditionError(
      absl::StrCat(op.DebugString(), ": a load has nothing to commit"));
}

}  // namespace ckpt::coordinator
