#include "coordinator/transfer_kinds.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/memory_path.h"
#include "coordinator/manifest_share.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {
namespace {

// The serving participants of a receive and who may read each stored piece.
struct Serving {
  std::vector<RankLocation> locations;  // serving rank world_size + i is served by locations[i]
  std::vector<std::string> worker_ids;  // the same, for the plan key
  std::vector<std::vector<int64_t>> readers;  // per manifest piece
};

// One serving participant per worker holding a file of `checkpoint` that serves no rank of
// `op` (a destination worker holding a file reads it itself, as in a memory load). Every
// piece's readers are the ranks on the workers holding its file. FailedPrecondition naming the
// version, the file and its tensors when a file has no copy left.
absl::StatusOr<Serving> ChooseServing(const Operation& op, const MemoryCheckpoint& checkpoint,
                                      const std::string& what) {
  std::map<std::string, std::vector<int64_t>> ranks_of_worker;
  for (int r = 0; r < op.world_size; ++r) {
    ranks_of_worker[op.ranks[r].location.worker_id].push_back(r);
  }
  Serving serving;
  std::map<std::string, std::vector<int64_t>> readers_of_file;
  for (const pb::DataFile& file : checkpoint.manifest.files()) {
    auto holders = checkpoint.holders.find(file.name());
    std::vector<int64_t>& readers = readers_of_file[file.name()];
    if (holders == checkpoint.holders.end()) continue;
    for (const MemoryHolder& h : holders->second) {
      auto ranks = ranks_of_worker.find(h.worker_id);
      if (ranks == ranks_of_worker.end()) {
        const int64_t rank = op.world_size + static_cast<int64_t>(serving.locations.size());
        RankLocation location;
        location.worker_id = h.worker_id;
        location.host = h.host;
        serving.locations.push_back(location);
        serving.worker_ids.push_back(h.worker_id);
        ranks = ranks_of_worker.emplace(h.worker_id, std::vector<int64_t>{rank}).first;
      }
      readers.insert(readers.end(), ranks->second.begin(), ranks->second.end());
    }
  }
  std::set<std::string> lost;
  for (const pb::StoredPiece& piece : checkpoint.manifest.pieces()) {
    std::vector<int64_t> readers = readers_of_file[piece.file()];
    if (readers.empty())
      lost.insert(absl::StrCat(piece.file(), " (holding \"", piece.key(), "\")"));
    serving.readers.push_back(std::move(readers));
  }
  if (!lost.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot receive ", what, ": no copy left of ", absl::StrJoin(lost, ", "),
                     " (its source workers were lost; publish it again)"));
  }
  return serving;
}

// `op` with the serving participants appended as ranks (no pieces), reading mem://<checkpoint>.
Operation WithServingRanks(const Operation& op, const Serving& serving,
                           const std::string& checkpoint) {
  Operation extended = op;
  extended.path = absl::StrCat(kMemoryPathPrefix, checkpoint);
  for (const RankLocation& location : serving.locations) {
    RankEntry entry;
    entry.joined = true;
    entry.location = location;
    entry.serving = true;
    extended.ranks.push_back(std::move(entry));
  }
  extended.world_size = static_cast<int>(extended.ranks.size());
  return extended;
}

// What changes per version and operation, written into (kept or new) plan parts.
struct PlanPatch {
  std::string path;  // mem://<checkpoint>
  std::string group;
  const pb::Manifest* manifest = nullptr;  // each part gets its share (ManifestShareFor)
  std::string name;
  int64_t version = 0;
  int destination_ranks = 0;
  bool verify = false;
  std::string source;                     // for serving ranks' messages
  std::vector<std::string> rank_workers;  // every rank's worker id
  bool reused = false;
};

absl::Status Patch(const PlanPatch& patch, const Serving& serving, std::vector<RankPlan>* plans) {
  for (size_t r = 0; r < plans->size(); ++r) {
    RankPlan& plan = (*plans)[r];
    pb::LoadPlanPart part;
    if (!part.ParseFromString(plan.part.Bytes())) {
      return absl::InternalError("receive plan part does not parse");
    }
    part.set_path(patch.path);
    part.set_group(patch.group);
    part.set_memory_manifest(ManifestShareFor(*patch.manifest, part).SerializeAsString());
    part.set_transfer_name(patch.name);
    part.set_transfer_version(patch.version);
    part.set_transfer_destination_ranks(patch.destination_ranks);
    part.set_transfer_verify(patch.verify);
    part.clear_transfer_rank_workers();
    for (const std::string& worker : patch.rank_workers) part.add_transfer_rank_workers(worker);
    plan.part = part.SerializeAsString();
    plan.reused = patch.reused;
    const int serving_index = static_cast<int>(r) - patch.destination_ranks;
    plan.serving.reset();
    plan.serving_source.clear();
    if (serving_index >= 0) {
      plan.serving = serving.locations[serving_index];
      plan.serving_source = patch.source;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void PublishedToProto(const PublishedRegistry& registry, const MemoryCatalog* catalog,
                      google::protobuf::RepeatedPtrField<pb::PublishedStatus>* out) {
  for (const auto& [name, versions] : registry.List()) {
    pb::PublishedStatus* published = out->Add();
    published->set_name(name);
    for (const PublishedVersion& v : versions) {
      pb::PublishedVersionStatus* status = published->add_versions();
      status->set_version(v.version);
      status->set_memory_checkpoint(v.memory_checkpoint);
      status->set_published_unix_ms(absl::ToUnixMillis(v.published));
      if (catalog == nullptr) continue;
      absl::StatusOr<MemoryCheckpoint> checkpoint = catalog->Find(v.memory_checkpoint);
      if (!checkpoint.ok()) continue;
      status->set_bytes(checkpoint->bytes);
      std::set<std::string> holders;
      for (const auto& [file, copies] : checkpoint->holders) {
        for (const MemoryHolder& h : copies) holders.insert(h.DebugString());
      }
      for (const std::string& h : holders) status->add_holders(h);
    }
  }
}

absl::StatusOr<Operation> PublishKind::AsMemorySave(const Operation& op) const {
  absl::StatusOr<std::pair<std::string, int64_t>> reserved = registry_->Reserved(op.id);
  if (!reserved.ok()) return reserved.status();
  Operation save = op;
  save.path =
      absl::StrCat(kMemoryPathPrefix, PublishedCheckpointName(reserved->first, reserved->second));
  if (save.memory_replicas < 0) save.memory_replicas = 0;  // the source's own workers only
  return save;
}

absl::StatusOr<std::vector<RankPlan>> PublishKind::Plan(const Operation& op) {
  absl::StatusOr<TransferPath> path = ParseTransferPath(op.path);
  if (!path.ok()) return path.status();
  if (path->verify) {
    return absl::InvalidArgumentError(absl::StrCat(
        "publishing ", op.path, ": ?verify is for receives (a publish keeps checksummed bytes)"));
  }
  absl::StatusOr<int64_t> version = registry_->Reserve(path->name, path->version, op.id);
  if (!version.ok()) return version.status();
  absl::StatusOr<Operation> save = AsMemorySave(op);
  absl::StatusOr<std::vector<RankPlan>> plans =
      save.ok() ? memory_.PlanInGroup(*save, RetentionGroupOfPublished(path->name))
                : absl::StatusOr<std::vector<RankPlan>>(save.status());
  if (!plans.ok()) {
    registry_->Release(op.id);
    return absl::Status(plans.status().code(),
                        absl::StrCat("publishing ", TransferPathString(path->name, *version), ": ",
                                     plans.status().message()));
  }
  return plans;
}

absl::Status PublishKind::Commit(Operation& op) {
  absl::StatusOr<Operation> save = AsMemorySave(op);
  if (!save.ok()) return save.status();
  absl::StatusOr<std::pair<std::string, int64_t>> reserved = registry_->Reserved(op.id);
  if (!reserved.ok()) return reserved.status();
  if (absl::Status committed = memory_.CommitPublished(*save, reserved->first, reserved->second);
      !committed.ok()) {
    return committed;
  }
  return registry_->Commit(op.id, absl::Now()).status();
}

absl::Status PublishKind::Finalize(const Operation& op) {
  absl::StatusOr<Operation> save = AsMemorySave(op);
  absl::Status finalized = save.ok() ? memory_.Finalize(*save) : absl::OkStatus();
  registry_->Release(op.id);  // no-op once committed
  return finalized;
}

absl::StatusOr<std::vector<RankPlan>> ReceiveKind::Plan(const Operation& op) {
  absl::StatusOr<TransferPath> path = ParseTransferPath(op.path);
  if (!path.ok()) return path.status();
  absl::StatusOr<PublishedVersion> version = registry_->Resolve(path->name, path->version);
  if (!version.ok()) return version.status();
  const std::string what = TransferPathString(path->name, version->version);
  absl::StatusOr<MemoryCheckpoint> checkpoint = catalog_->Find(version->memory_checkpoint);
  if (!checkpoint.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot receive ", what, ": its memory checkpoint ",
                                            version->memory_checkpoint, " is gone (",
                                            checkpoint.status().message(), ")"));
  }
  absl::StatusOr<Serving> serving = ChooseServing(op, *checkpoint, what);
  if (!serving.ok()) return serving.status();
  LoadPlannerOptions options = defaults_;
  if (op.load_memory_budget_bytes > 0) options.memory_budget_bytes = op.load_memory_budget_bytes;
  // The readers are the holders, who exchange; verify checks whole units, which broadcast
  // delivers as they were read.
  options.algorithm = op.load_algorithm;
  if (path->verify || options.algorithm == pb::LOAD_DIRECT || options.algorithm == pb::LOAD_AUTO ||
      options.algorithm == pb::LOAD_ALGORITHM_UNSPECIFIED) {
    options.algorithm = pb::LOAD_BROADCAST;
  }
  const std::string key =
      TransferPlanKey(ManifestLayoutDigest(checkpoint->manifest), op, serving->worker_ids,
                      options.algorithm, options.memory_budget_bytes);
  std::optional<std::vector<RankPlan>> plans = cache_->Find(key);
  PlanPatch patch;
  patch.reused = plans.has_value();
  if (!plans.has_value()) {
    absl::StatusOr<std::vector<RankPlan>> planned =
        PlanExchangeLoadFrom(WithServingRanks(op, *serving, version->memory_checkpoint), options,
                             checkpoint->manifest, serving->readers);
    if (!planned.ok()) {
      return absl::Status(planned.status().code(), absl::StrCat("planning the receive of ", what,
                                                                ": ", planned.status().message()));
    }
    plans = *std::move(planned);
    cache_->Keep(key, *plans);
  }
  patch.path = absl::StrCat(kMemoryPathPrefix, version->memory_checkpoint);
  patch.group = absl::StrCat("load/", op.id);
  patch.manifest = &checkpoint->manifest;
  patch.name = path->name;
  patch.version = version->version;
  patch.destination_ranks = op.world_size;
  patch.verify = path->verify;
  patch.source = absl::StrCat(what, " (mem://", version->memory_checkpoint, ")");
  for (int r = 0; r < op.world_size; ++r)
    patch.rank_workers.push_back(op.ranks[r].location.worker_id);
  for (const std::string& worker : serving->worker_ids) patch.rank_workers.push_back(worker);
  if (absl::Status s = Patch(patch, *serving, &*plans); !s.ok()) return s;
  for (RankPlan& plan : *plans) plan.received_version = version->version;
  return *std::move(plans);
}

absl::StatusOr<std::vector<RankPlan>> ServedMemoryLoadKind::Plan(const Operation& op) {
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (!name.ok()) return memory_loads_->Plan(op);
  absl::StatusOr<MemoryCheckpoint> checkpoint = catalog_->Find(*name);
  if (!checkpoint.ok()) return memory_loads_->Plan(op);
  std::set<std::string> load_workers;
  for (int r = 0; r < op.world_size; ++r) load_workers.insert(op.ranks[r].location.worker_id);
  bool outside = false;  // some file is held only by workers outside the load
  for (const pb::DataFile& file : checkpoint->manifest.files()) {
    auto holders = checkpoint->holders.find(file.name());
    if (holders == checkpoint->holders.end() || holders->second.empty()) {
      return memory_loads_->Plan(op);  // no copy left: its refusal names what is lost
    }
    bool inside = false;
    for (const MemoryHolder& h : holders->second)
      inside = inside || load_workers.count(h.worker_id);
    outside = outside || !inside;
  }
  if (!outside) return memory_loads_->Plan(op);
  const std::string what = absl::StrCat(kMemoryPathPrefix, *name);
  absl::StatusOr<Serving> serving = ChooseServing(op, *checkpoint, what);
  if (!serving.ok()) return serving.status();
  LoadPlannerOptions options = defaults_;
  if (op.load_memory_budget_bytes > 0) options.memory_budget_bytes = op.load_memory_budget_bytes;
  options.algorithm = op.load_algorithm;
  if (options.algorithm == pb::LOAD_DIRECT || options.algorithm == pb::LOAD_AUTO ||
      options.algorithm == pb::LOAD_ALGORITHM_UNSPECIFIED) {
    options.algorithm = pb::LOAD_BROADCAST;
  }
  absl::StatusOr<std::vector<RankPlan>> plans = PlanExchangeLoadFrom(
      WithServingRanks(op, *serving, *name), options, checkpoint->manifest, serving->readers);
  if (!plans.ok()) return plans.status();
  PlanPatch patch;
  patch.path = what;
  patch.group = absl::StrCat("load/", op.id);
  patch.manifest = &checkpoint->manifest;
  patch.destination_ranks = op.world_size;
  patch.source = what;
  for (int r = 0; r < op.world_size; ++r)
    patch.rank_workers.push_back(op.ranks[r].location.worker_id);
  for (const std::string& worker : serving->worker_ids) patch.rank_workers.push_back(worker);
  if (absl::Status s = Patch(patch, *serving, &*plans); !s.ok()) return s;
  return plans;
}

absl::Status ReceiveKind::Commit(Operation& op) {
  return absl::FailedPreconditionError(
      absl::StrCat(op.DebugString(), ": a receive has nothing to commit"));
}

}  // namespace ckpt::coordinator
