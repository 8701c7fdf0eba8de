#include "coordinator/memory_kinds.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/memory_path.h"
#include "coordinator/manifest_share.h"
#include "coordinator/operation_planners.h"
#include "coordinator/save_commit.h"
#include "proto/coordinator.pb.h"
#include "storage/manifest_codec.h"

namespace ckpt::coordinator {
namespace {

// "a, b and 3 more" for messages.
std::string ShortList(const std::vector<std::string>& items, size_t shown = 4) {
  std::vector<std::string> head(items.begin(), items.begin() + std::min(shown, items.size()));
  std::string out = absl::StrJoin(head, ", ");
  if (items.size() > shown) absl::StrAppend(&out, " and ", items.size() - shown, " more");
  return out;
}

// Rank r's files: the DataFiles of the manifest written by r.
std::vector<MemoryHolder> HoldersOf(const Operation& op, int writer,
                                    const std::vector<int>& replicas) {
  std::vector<MemoryHolder> holders;
  holders.push_back({op.ranks[writer].location.worker_id, op.ranks[writer].location.host});
  for (int r : replicas)
    holders.push_back({op.ranks[r].location.worker_id, op.ranks[r].location.host});
  return holders;
}

// Why a file of `checkpoint` cannot be read by this load: no copy left, or copies only on
// workers serving no rank of it.
std::string WhyUnreadable(const MemoryCheckpoint& checkpoint, const std::string& file) {
  std::vector<std::string> tensors;
  for (const pb::StoredPiece& p : checkpoint.manifest.pieces()) {
    if (p.file() == file)
      tensors.push_back(absl::StrCat("\"", p.key(), "\" (", p.entry_name(), ")"));
  }
  std::vector<std::string> lost, elsewhere;
  if (auto it = checkpoint.lost.find(file); it != checkpoint.lost.end()) {
    for (const MemoryHolder& h : it->second) lost.push_back(h.DebugString());
  }
  if (auto it = checkpoint.holders.find(file); it != checkpoint.holders.end()) {
    for (const MemoryHolder& h : it->second) elsewhere.push_back(h.DebugString());
  }
  std::string why = absl::StrCat(file, " holding ", ShortList(tensors));
  if (elsewhere.empty()) {
    absl::StrAppend(&why, ": no copy left (lost with ",
                    lost.empty() ? "no recorded holder" : ShortList(lost),
                    checkpoint.rebuilt ? "; no worker holding it registered with the restarted "
                                         "coordinator"
                                       : "",
                    ")");
  } else {
    absl::StrAppend(&why, ": held only by ", ShortList(elsewhere),
                    ", which serves no rank of this load",
                    lost.empty() ? "" : absl::StrCat(" (lost with ", ShortList(lost), ")"));
  }
  return why;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(const Operation& op, int replicas) {
  std::vector<std::vector<int>> out(op.world_size);
  if (replicas <= 0) return out;
  for (int r = 0; r < op.world_size; ++r) {
    const RankLocation& home = op.ranks[r].location;
    std::set<std::string> workers;  // one copy per worker
    std::vector<int> others;        // the first rank of each worker on another host
    for (int c = 0; c < op.world_size; ++c) {
      const RankLocation& there = op.ranks[c].location;
      if (there.host == home.host || there.worker_id == home.worker_id) continue;
      if (workers.insert(there.worker_id).second) others.push_back(c);
    }
    // Rotated by r, so that the copies of different ranks land on different workers.
    std::vector<int> candidates;
    for (size_t k = 0; k < others.size(); ++k) {
      candidates.push_back(others[(static_cast<size_t>(r) + k) % others.size()]);
    }
    if (static_cast<int>(candidates.size()) < replicas) {
      return absl::FailedPreconditionError(absl::StrCat(
          "memory save ", op.path, " needs ", replicas, " replica(s) of rank ", r, " (",
          home.DebugString(), ") on workers of other hosts, but this save's workers offer ",
          candidates.size(), " (every rank of it is served on host ", home.host,
          " or the same worker); add workers on another host or save with fewer replicas"));
    }
    candidates.resize(replicas);
    out[r] = std::move(candidates);
  }
  return out;
}

absl::StatusOr<std::vector<RankPlan>> MemorySaveKind::Plan(const Operation& op) {
  return PlanInGroup(op, "");
}

absl::StatusOr<std::vector<RankPlan>> MemorySaveKind::PlanInGroup(const Operation& op,
                                                                  const std::string& group) {
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (!name.ok()) return name.status();
  // Keep-newest would evict a checkpoint still being persisted: refused, naming what it waits for.
  if (absl::Status room = catalog_->CheckRoomForOneMore(keep_newest_, group); !room.ok()) {
    return room;
  }
  const int replicas = op.memory_replicas >= 0 ? op.memory_replicas : replicas_;
  absl::StatusOr<std::vector<std::vector<int>>> placement = PlaceReplicas(op, replicas);
  if (!placement.ok()) return placement.status();
  if (absl::Status claimed = catalog_->Claim(*name, op.id); !claimed.ok()) return claimed;
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op, {}, op.path);
  if (!plans.ok()) {
    catalog_->Release(*name, op.id);
    return plans.status();
  }
  for (int r = 0; r < op.world_size; ++r) {
    pb::SavePlanPart part;
    if (!part.ParseFromString((*plans)[r].part.Bytes())) {
      catalog_->Release(*name, op.id);
      return absl::InternalError("save plan part does not parse");
    }
    part.set_memory_checkpoint(*name);
    for (int replica : (*placement)[r]) part.add_replica_ranks(replica);
    if (replicas > 0) part.set_group(absl::StrCat("save/", op.id));  // no copies: no exchange
    part.set_world_size(op.world_size);
    part.set_keep_newest(keep_newest_);
    part.set_retention_group(group);
    part.set_persist_pending(!op.persist_to.empty());  // pinned until persisted or failed
    (*plans)[r].part = part.SerializeAsString();
  }
  std::lock_guard<std::mutex> lock(mu_);
  placement_[op.id] = *std::move(placement);
  return plans;
}

absl::Status MemorySaveKind::Commit(Operation& op) { return CommitPublished(op, "", 0); }

absl::Status MemorySaveKind::CommitPublished(const Operation& op, const std::string& published_name,
                                             int64_t published_version) {
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (!name.ok()) return name.status();
  std::vector<std::vector<int>> placement;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = placement_.find(op.id);
    if (it == placement_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(op.DebugString(), " was not planned here"));
    }
    placement = it->second;
  }
  absl::StatusOr<pb::Manifest> manifest = MergeManifest(op);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status valid = ValidateManifest(*manifest); !valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat("memory checkpoint ", op.path, ": ", valid.message()));
  }
  MemoryCheckpoint checkpoint;
  checkpoint.name = *name;
  checkpoint.committed = absl::Now();
  for (const pb::DataFile& file : manifest->files()) {
    const int writer = file.writer_rank();
    if (writer < 0 || writer >= op.world_size) {
      return absl::DataLossError(absl::StrCat("memory checkpoint ", op.path, ": ", file.name(),
                                              " names writer rank ", writer));
    }
    checkpoint.holders[file.name()] = HoldersOf(op, writer, placement[writer]);
    checkpoint.bytes += file.size_bytes();
  }
  checkpoint.manifest = *std::move(manifest);
  checkpoint.published_name = published_name;
  checkpoint.published_version = published_version;
  if (!op.persist_to.empty()) {  // never evicted before the persistence ended
    checkpoint.persist_to = op.persist_to;
    checkpoint.persist_overwrite = op.persist_overwrite;
    checkpoint.persist_state = PersistState::kPersisting;
  }
  absl::StatusOr<std::vector<std::string>> forgotten =
      catalog_->Commit(op.id, std::move(checkpoint), keep_newest_);
  return forgotten.status();
}

absl::Status MemorySaveKind::Finalize(const Operation& op) {
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (name.ok()) catalog_->Release(*name, op.id);  // no-op once committed
  std::lock_guard<std::mutex> lock(mu_);
  placement_.erase(op.id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankPlan>> MemoryLoadKind::Plan(const Operation& op) {
  absl::StatusOr<std::string> name = MemoryCheckpointName(op.path);
  if (!name.ok()) return name.status();
  absl::StatusOr<MemoryCheckpoint> checkpoint = catalog_->Find(*name);
  if (!checkpoint.ok()) return checkpoint.status();
  LoadPlannerOptions options = defaults_;
  if (op.load_algorithm != pb::LOAD_ALGORITHM_UNSPECIFIED) options.algorithm = op.load_algorithm;
  if (op.load_memory_budget_bytes > 0) options.memory_budget_bytes = op.load_memory_budget_bytes;
  // Nobody can read a memory checkpoint "directly": the holders read and exchange.
  if (options.algorithm == pb::LOAD_DIRECT || options.algorithm == pb::LOAD_AUTO ||
      options.algorithm == pb::LOAD_ALGORITHM_UNSPECIFIED) {
    options.algorithm = pb::LOAD_BROADCAST;
  }
  std::map<std::string, std::vector<int64_t>> ranks_of_worker;
  for (int r = 0; r < op.world_size; ++r) {
    ranks_of_worker[op.ranks[r].location.worker_id].push_back(r);
  }
  const pb::Manifest& manifest = checkpoint->manifest;
  std::vector<std::vector<int64_t>> readers(manifest.pieces_size());
  std::set<std::string> unreadable;
  for (int i = 0; i < manifest.pieces_size(); ++i) {
    const std::string& file = manifest.pieces(i).file();
    auto holders = checkpoint->holders.find(file);
    if (holders != checkpoint->holders.end()) {
      for (const MemoryHolder& h : holders->second) {
        auto ranks = ranks_of_worker.find(h.worker_id);
        if (ranks == ranks_of_worker.end()) continue;
        readers[i].insert(readers[i].end(), ranks->second.begin(), ranks->second.end());
      }
    }
    if (readers[i].empty()) unreadable.insert(file);
  }
  absl::StatusOr<std::vector<RankPlan>> plans =
      PlanExchangeLoadFrom(op, options, manifest, std::move(readers));
  if (!plans.ok() && plans.status().code() == absl::StatusCode::kFailedPrecondition &&
      !unreadable.empty()) {
    std::vector<std::string> why;
    for (const std::string& file : unreadable) why.push_back(WhyUnreadable(*checkpoint, file));
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load memory checkpoint ", op.path, ": ", absl::StrJoin(why, "; ")));
  }
  if (!plans.ok()) return plans.status();
  for (RankPlan& plan : *plans) {
    pb::LoadPlanPart part;
    if (!part.ParseFromString(plan.part.Bytes()))
      return absl::InternalError("load plan part does not parse");
    part.set_memory_manifest(ManifestShareFor(manifest, part).SerializeAsString());
    plan.part = part.SerializeAsString();
  }
  return plans;
}

absl::Status MemoryLoadKind::Commit(Operation& op) {
  return absl::FailedPreconditionError(
      absl::StrCat(op.DebugString(), ": a load has nothing to commit"));
}

OperationKindHandler* PathDispatchKind::For(const Operation& op) const {
  return matches_(op.path) ? matching_ : others_;
}

absl::StatusOr<std::vector<RankPlan>> PathDispatchKind::Plan(const Operation& op) {
  return For(op)->Plan(op);
}

absl::Status PathDispatchKind::Prepare(const Operation& op) { return For(op)->Prepare(op); }

std::optional<std::vector<RankPlan>> PathDispatchKind::ReusedPlan(const Operation& op) {
  return For(op)->ReusedPlan(op);
}

absl::Status PathDispatchKind::Commit(Operation& op) { return For(op)->Commit(op); }

absl::Status PathDispatchKind::Finalize(const Operation& op) { return For(op)->Finalize(op); }

}  // namespace ckpt::coordinator
