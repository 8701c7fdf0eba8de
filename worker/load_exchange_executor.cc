#include "worker/load_exchange_executor.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/memory_path.h"
#include "common/status_macros.h"
#include "exchange/communicator_factory.h"
#include "exchange/exchange.h"
#include "exchange/staging_arena.h"
#include "proto/convert.h"
#include "proto/wire_names.h"
#include "rendezvous/grpc_store.h"
#include "sharding/overlap.h"
#include "storage/checkpoint_reader.h"
#include "storage/manifest_share.h"
#include "worker/load_communicator.h"
#include "worker/load_executor.h"
#include "worker/load_wave_plan.h"
#include "worker/memory_tier.h"
#include "worker/transfer_verify.h"

namespace ckpt::worker {
namespace {

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

// Where a part's units are read from: a committed checkpoint in storage (the share of its
// manifest the part carries, or the whole manifest), or a memory checkpoint in this worker's
// memory tier (part.memory_manifest() set).
struct LoadSource {
  std::unique_ptr<CheckpointReader> storage;
  // What the part's units index when it is not the storage reader's manifest: the memory
  // checkpoint's manifest, or a share's pieces followed by its unread pieces.
  std::optional<pb::Manifest> units;
  std::map<std::string, const pb::TensorMeta*> memory_tensors;
  std::function<absl::Status(const std::vector<PieceRead>&)> read_pieces;

  const pb::Manifest& manifest() const { return units.has_value() ? *units : storage->manifest(); }
  const pb::TensorMeta* FindTensor(const std::string& key) const {
    if (storage != nullptr) return storage->FindTensor(key);
    auto it = memory_tensors.find(key);
    return it == memory_tensors.end() ? nullptr : it->second;
  }
};

// The checkpoint of a storage part: only the share of its manifest the coordinator sent (its
// units index the share's pieces, then its unread pieces: `units`), or (a part without one)
// the whole manifest.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenStorage(const pb::LoadPlanPart& part,
                                                              std::optional<pb::Manifest>* units) {
  if (part.manifest_share().empty()) return CheckpointReader::Open(part.path());
  pb::ManifestShare share;
  if (!share.ParseFromString(part.manifest_share())) {
    return absl::DataLossError("the plan part's manifest share is not a valid protobuf");
  }
  CKPT_ASSIGN_OR_RETURN(pb::Manifest read, ExpandManifestShare(share));
  CKPT_ASSIGN_OR_RETURN(std::vector<pb::StoredPiece> unread, ExpandUnreadPieces(share));
  *units = read;
  for (pb::StoredPiece& p : unread) *(*units)->add_pieces() = std::move(p);
  return CheckpointReader::OpenShare(part.path(), std::move(read));
}

// Opens the part's source; errors name `who` and the checkpoint.
absl::StatusOr<std::unique_ptr<LoadSource>> OpenLoadSource(const pb::LoadPlanPart& part,
                                                           const MemoryTier* tier,
                                                           const std::string& who) {
  auto source = std::make_unique<LoadSource>();
  if (part.memory_manifest().empty()) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = OpenStorage(part, &source->units);
    if (!reader.ok()) {
      return absl::Status(
          reader.status().code(),
          absl::StrCat(who, ": opening checkpoint ", part.path(), ": ", reader.status().message()));
    }
    source->storage = *std::move(reader);
    const CheckpointReader* r = source->storage.get();
    source->read_pieces = [r](const std::vector<PieceRead>& reads) { return r->ReadPieces(reads); };
    return source;
  }
  source->units.emplace();
  if (!source->units->ParseFromString(part.memory_manifest())) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": the plan's manifest of ", part.path(), " does not parse"));
  }
  for (const pb::TensorMeta& t : source->units->tensors()) {
    source->memory_tensors.emplace(t.key(), &t);
  }
  absl::StatusOr<std::string> name = MemoryCheckpointName(part.path());
  if (!name.ok()) return name.status();
  const pb::Manifest* manifest = &*source->units;
  source->read_pieces = [tier, manifest, name = *name,
                         who](const std::vector<PieceRead>& reads) -> absl::Status {
    if (reads.empty()) return absl::OkStatus();
    if (tier == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, ": this worker has no memory tier to read mem://", name, " from"));
    }
    return ReadHeldPieces(*tier, name, *manifest, reads);
  };
  return source;
}

// Everything the waves of one part share.
struct WaveRunContext {
  const std::string& who;  // "rank <r> of job <j>"
  const pb::LoadPlanPart& part;
  const LoadSource& source;
  TensorLookup tensors;
  const std::vector<LoadRequest>& requests;
  int me = 0;
  bool narrow = false;
  Communicator& comm;
  const ExchangeOptions& exchange_options;
  MemoryGate& gate;
  ExchangeLoadStats* stats;
  StagingArena* receive_arena;    // this rank's received shards of a wave, kept across waves
  ShardBufferPool* read_buffers;  // what ReadUnits reads into, given back after each wave
};

// `part` with each unit's `piece` set to its share_piece (the share's numbering).
pb::LoadPlanPart WithSharePieces(const pb::LoadPlanPart& part) {
  pb::LoadPlanPart out = part;
  for (pb::LoadWaveEntry& wave : *out.mutable_waves()) {
    for (pb::LoadUnitEntry& u : *wave.mutable_units()) u.set_piece(u.share_piece());
  }
  return out;
}

// Validate: the part is this session's rank's and names a sane world.
absl::Status ValidatePart(const pb::LoadPlanPart& part, const SessionInfo& session,
                          const std::string& who) {
  if (part.rank() != session.trainer.rank) {
    return absl::InternalError(absl::StrCat("load plan part of rank ", part.rank(),
                                            " delivered for rank ", session.trainer.rank,
                                            " of job ", session.trainer.job));
  }
  const int me = CommunicatorRank(part);
  if (part.world_size() <= 0 || me < 0 || me >= part.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": load plan part names world size ",
                                                   part.world_size(), " for group rank ", me));
  }
  if (part.group_ranks_size() > 0 &&
      (part.group_ranks_size() != part.world_size() || part.group_ranks(me) != part.rank())) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": load plan part of process group ",
                                                   part.group_index(), " does not place rank ",
                                                   part.rank(), " at its group rank ", me));
  }
  return absl::OkStatus();
}

// Points this rank's requests into the trainer's shared tensors (each must be the host tensor
// the plan says, with the request's key, region and size).
// Device tensors get a host buffer each (`device_shadows`), copied onto the device once every
// wave has been scattered into it.
using DeviceShadows = std::vector<std::pair<const RegisteredTensor*, std::unique_ptr<char[]>>>;

absl::Status BindToTrainerTensors(std::vector<LoadRequest>& requests, int me,
                                  const SessionInfo& session, PinnedStagingPool* device_staging,
                                  DeviceShadows* device_shadows, const std::string& who) {
  for (LoadRequest& q : requests) {
    if (q.rank != me) continue;
    if (q.local_index < 0 || q.local_index >= static_cast<int>(session.tensors.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": tensor ", q.key, " (local index ", q.local_index, ") is not among the ",
          session.tensors.size(),
          " tensors the trainer shares now (did it re-register its state during the load?)"));
    }
    const RegisteredTensor& t = session.tensors[q.local_index];
    absl::StatusOr<Region> shared = RegionFromProto(t.shard.region());
    if (!shared.ok() || t.shard.tensor().key() != q.key || *shared != q.region ||
        t.nbytes != q.region.NumElements() * DTypeSize(q.dtype)) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, ": the plan's read of ", q.key, " ", q.region.DebugString(),
                       " does not match the shared tensor ", t.shard.tensor().key()));
    }
    if (t.memory_kind == pb::MEMORY_DEVICE) {
      if (device_staging == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(who, ": tensor ", q.key, " is in device memory (device ", t.device,
                         ") but this worker has no device staging (it serves no GPU)"));
      }
      device_shadows->emplace_back(&t, new char[std::max<int64_t>(t.nbytes, 1)]);
      q.dest = device_shadows->back().second.get();
    } else if (t.memory_kind != pb::MEMORY_HOST || (t.data == nullptr && t.nbytes > 0)) {
      return absl::FailedPreconditionError(absl::StrCat(who, ": tensor ", q.key, " is in ",
                                                        MemoryKindName(t.memory_kind),
                                                        " memory not mapped here"));
    } else {
      q.dest = reinterpret_cast<char*>(t.data);
    }
  }
  return absl::OkStatus();
}

// Rendezvous: joins the operation's communicator through `store`, on the transport the
// coordinator chose (worker/load_communicator.h), or reuses the one this rank kept from an
// earlier operation of the same ranks when all of them agree.
absl::StatusOr<PartCommunicator> JoinCommunicator(const pb::LoadPlanPart& part,
                                                  const ExchangeLoadContext& context, Store* store,
                                                  const std::string& who,
                                                  ExchangeLoadStats* stats) {
  LoadCommunicatorConfig config;
  config.hostname = context.hostname;
  config.gloo_loop_thread_nice = context.gloo_loop_thread_nice;
  config.cuda_device = context.cuda_device;
  config.rendezvous_address = context.rendezvous_address;
  config.rendezvous_timeout = context.rendezvous_timeout;
  CommunicatorCache* cache =
      context.communicators != nullptr ? context.communicators : SharedCommunicators();
  const absl::Time start = absl::Now();
  absl::StatusOr<PartCommunicator> comm = JoinOrReuseLoadCommunicator(
      part, config, store, who, cache, CommunicatorCacheKey(part, config));
  stats->rendezvous_time = absl::Now() - start;
  if (comm.ok()) stats->communicator_reused = comm->reused();
  return comm;
}

// Read: this rank's units of the wave from storage into `loaded`.
absl::Status ReadUnits(const WaveRunContext& run, const WaveExchange& wave, ShardBuffers* loaded,
                       const std::string& where) {
  std::vector<PieceRead> reads;
  for (const UnitRead& u : wave.reads) {
    std::string& buffer = (*loaded)[u.id];
    if (buffer.empty()) buffer = run.read_buffers->Take(static_cast<size_t>(u.end - u.begin));
    buffer.resize(u.end - u.begin);
    reads.push_back(PieceRead{u.piece, u.begin, u.end, buffer.data()});
    run.stats->bytes_read += static_cast<int64_t>(buffer.size());
  }
  if (reads.empty()) return absl::OkStatus();
  absl::Status s = run.source.read_pieces(reads);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(where, ": reading from ", run.part.path(), ": ", s.message()));
  }
  return absl::OkStatus();
}

// Scatter: what this rank received into the trainer's tensors, through the gate.
absl::Status Scatter(const WaveRunContext& run, const WaveExchange& wave,
                     const DestinationBuffers& received, const std::string& where) {
  const std::vector<PieceSpec>& needs = wave.plan.needs[run.me];
  for (int i = 0; i < static_cast<int>(needs.size()); ++i) {
    auto buffer = received.find(needs[i].id);
    if (buffer == received.end()) {
      return absl::InternalError(
          absl::StrCat(where, ": the exchange did not deliver ", needs[i].id.DebugString()));
    }
    for (int q : wave.my_targets[i]) {
      const LoadRequest& request = run.requests[q];
      absl::StatusOr<std::vector<CopyRun>> runs =
          OverlapRuns(needs[i].region, request.region, request.shape);
      if (!runs.ok()) {
        return absl::Status(runs.status().code(), absl::StrCat(where, ": scattering ", request.key,
                                                               ": ", runs.status().message()));
      }
      const int64_t elem = DTypeSize(request.dtype);
      absl::Status copied = run.gate.CopyRuns(*runs, elem, buffer->second.data(), request.dest);
      if (!copied.ok()) {
        return absl::Status(copied.code(), absl::StrCat(where, ": stopped scattering ", request.key,
                                                        ": ", copied.message()));
      }
      for (const CopyRun& r : *runs) run.stats->bytes_scattered += r.length * elem;
    }
  }
  return absl::OkStatus();
}

// Receive buffers for `needs`, carved from `arena` (kept across waves and operations, so a
// receive writes pages faulted in before instead of fresh zero-filled ones).
absl::StatusOr<DestinationBuffers> ReceiveBuffers(const std::vector<PieceSpec>& needs,
                                                  StagingArena& arena, const std::string& where) {
  constexpr int64_t kAlign = 64;
  int64_t total = 0;
  for (const PieceSpec& need : needs) total += (need.NumBytes() + kAlign - 1) / kAlign * kAlign;
  absl::StatusOr<char*> block = arena.Reserve(static_cast<size_t>(total));
  if (!block.ok()) {
    return absl::Status(block.status().code(),
                        absl::StrCat(where, ": receive buffers: ", block.status().message()));
  }
  DestinationBuffers out;
  int64_t at = 0;
  for (const PieceSpec& need : needs) {
    out[need.id] = absl::Span<char>(*block + at, static_cast<size_t>(need.NumBytes()));
    at += (need.NumBytes() + kAlign - 1) / kAlign * kAlign;
  }
  return out;
}

// Exchange: what this rank needs into `received`, from the pooled receive arena (verify mode:
// into `allocated`, which VerifyReceivedUnits checks).
absl::Status Exchange(const WaveRunContext& run, const WaveExchange& wave,
                      const ShardBuffers& loaded, ShardBuffers* allocated,
                      DestinationBuffers* received, ExchangeReport* report,
                      const std::string& where) {
  const std::string algorithm(LoadAlgorithmName(run.part.algorithm()));
  absl::Status s;
  if (run.part.transfer_verify()) {
    absl::StatusOr<ShardBuffers> got = ExchangeByDistribution(algorithm, run.comm, wave.plan,
                                                              loaded, run.exchange_options, report);
    if (got.ok()) {
      *allocated = *std::move(got);
      *received = DestinationsOf(*allocated);
    }
    s = got.status();
  } else {
    CKPT_ASSIGN_OR_RETURN(*received,
                          ReceiveBuffers(wave.plan.needs[run.me], *run.receive_arena, where));
    s = ExchangeByDistributionInto(algorithm, run.comm, wave.plan, loaded, *received,
                                   run.exchange_options, report);
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(where, ": exchange failed: ", s.message()));
  }
  return absl::OkStatus();
}

// One wave: plan, read, exchange, scatter.
absl::Status RunWave(const WaveRunContext& run, int w) {
  const pb::LoadWaveEntry& entry = run.part.waves(w);
  const std::string where = absl::StrCat(run.who, ": wave ", w + 1, " of ", run.part.waves_size(),
                                         " (", LoadAlgorithmName(run.part.algorithm()), ")");
  if (absl::Status closed = run.gate.status(); !closed.ok()) {
    return absl::Status(closed.code(), absl::StrCat(where, ": ", closed.message()));
  }
  CKPT_ASSIGN_OR_RETURN(WaveExchange wave,
                        BuildWaveExchange(entry, run.source.manifest(), run.tensors, run.requests,
                                          run.me, run.part.world_size(), run.narrow, where));
  wave.plan.own_share = run.part.own_share();  // overlap_all_to_all packs sub-waves by pairs
  ShardBuffers loaded;
  absl::Time step_start = absl::Now();
  CKPT_RETURN_IF_ERROR(ReadUnits(run, wave, &loaded, where));
  run.stats->read_time += absl::Now() - step_start;
  // Verify mode (receives): the readers' checksums of what they send (worker/transfer_verify.h).
  std::vector<uint64_t> read_checksums;
  if (run.part.transfer_verify()) {
    CKPT_ASSIGN_OR_RETURN(read_checksums, ChecksumsOfReadUnits(wave.plan, run.me, loaded, where));
    CorruptSentUnitsForTest(run.part, wave.plan, run.me, &loaded);
  }
  step_start = absl::Now();
  ExchangeReport report;
  ShardBuffers allocated;
  DestinationBuffers received;
  CKPT_RETURN_IF_ERROR(Exchange(run, wave, loaded, &allocated, &received, &report, where));
  run.stats->bytes_sent += report.bytes_sent();
  run.stats->bytes_received += report.bytes_received();
  for (auto& entry : loaded) run.read_buffers->Give(std::move(entry.second));
  loaded.clear();
  if (run.part.transfer_verify()) {
    CKPT_RETURN_IF_ERROR(VerifyReceivedUnits(run.part, entry, wave.plan, run.me, read_checksums,
                                             allocated, run.comm, run.exchange_options.deadline,
                                             where));
  }
  run.stats->exchange_time += absl::Now() - step_start;
  step_start = absl::Now();
  CKPT_RETURN_IF_ERROR(Scatter(run, wave, received, where));
  run.stats->scatter_time += absl::Now() - step_start;
  return absl::OkStatus();
}

}  // namespace

StagingArenaPool& SharedExchangeBuffers() {
  static StagingArenaPool* pool = new StagingArenaPool(kSharedExchangeBufferBytes);
  return *pool;
}

ShardBufferPool& SharedShardBuffers() {
  static ShardBufferPool* pool = new ShardBufferPool(kSharedShardBufferBytes);
  return *pool;
}

absl::Status ExecuteExchangeLoadPart(const pb::LoadPlanPart& sent, const SessionInfo& session,
                                     const ExchangeLoadContext& context, MemoryGate& gate,
                                     ExchangeLoadStats* stats,
                                     const std::function<void(int64_t bytes_done)>& progress,
                                     PinnedStagingPool* device_staging) {
  // A part with a share names its units' pieces by share_piece (its `piece` is -1, so that a
  // worker predating shares refuses it); the executor indexes the share by `piece`.
  std::optional<pb::LoadPlanPart> renumbered;
  if (!sent.manifest_share().empty()) renumbered = WithSharePieces(sent);
  const pb::LoadPlanPart& part = renumbered.has_value() ? *renumbered : sent;
  ExchangeLoadStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = ExchangeLoadStats();
  const int me = CommunicatorRank(part);
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", session.trainer.job);
  CKPT_RETURN_IF_ERROR(ValidatePart(part, session, who));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<LoadSource> source,
                        OpenLoadSource(part, context.memory_tier, who));
  const LoadSource& checkpoint = *source;
  TensorLookup tensors = [&checkpoint](const std::string& key) {
    return checkpoint.FindTensor(key);
  };
  CKPT_ASSIGN_OR_RETURN(std::vector<LoadRequest> requests, ResolveRequests(part, tensors, who));
  DeviceShadows device_shadows;
  CKPT_RETURN_IF_ERROR(
      BindToTrainerTensors(requests, me, session, device_staging, &device_shadows, who));
  CKPT_RETURN_IF_ERROR(CheckDeliveriesTileRequests(part, checkpoint.manifest(), requests, me, who));

  GrpcStore grpc_store(context.rendezvous_address, context.rendezvous_security);
  CancellableStore store(&grpc_store, &gate);
  CKPT_ASSIGN_OR_RETURN(PartCommunicator comm, JoinCommunicator(part, context, &store, who, stats));
  ExchangeOptions exchange_options;
  if (part.memory_budget_bytes() > 0) {
    exchange_options.memory_budget_bytes = part.memory_budget_bytes();
  }
  exchange_options.deadline = absl::Now() + context.exchange_timeout;
  // Staging and receive blocks for every wave, leased from the worker's pool, so their pages
  // are faulted in once per worker, not once per operation or wave.
  StagingArenaPool& pool = context.buffers != nullptr ? *context.buffers : SharedExchangeBuffers();
  StagingArenaPool::Lease staging = pool.Acquire("exchange staging");
  StagingArenaPool::Lease receive = pool.Acquire("exchange receive");
  exchange_options.staging = staging.get();
  const WaveRunContext run{
      who,
      part,
      checkpoint,
      tensors,
      requests,
      me,
      part.algorithm() == pb::LOAD_OVERLAP_ALL_TO_ALL,
      comm.get(),
      exchange_options,
      gate,
      stats,
      receive.get(),
      context.read_buffers != nullptr ? context.read_buffers : &SharedShardBuffers()};
  for (int w = 0; w < part.waves_size(); ++w) {
    CKPT_RETURN_IF_ERROR(RunWave(run, w));
    if (progress) progress(stats->bytes_scattered);
  }
  // Device tensors: every wave has been scattered into their host buffers; onto the device now.
  const absl::Time device_start = absl::Now();
  for (const auto& [tensor, shadow] : device_shadows) {
    absl::Status s = CopyOntoDevice(*tensor, shadow.get(), device_staging, gate, who);
    if (!s.ok()) return s;
  }
  stats->scatter_time += absl::Now() - device_start;
  comm.Finish(absl::OkStatus());  // kept for the next operation of these ranks
  return absl::OkStatus();
}

}  // namespace ckpt::worker
