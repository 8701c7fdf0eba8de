// The in-memory tier's operation kinds (mem://<name> paths), and the dispatcher that routes a
// save or load to them or to the storage kinds by its path:
// - MemorySaveKind plans a save like a storage save (PlanSave), but each rank's worker keeps
//   its files in its memory tier and copies them to `replicas` workers on other hosts
//   (PlaceReplicas); the commit merges the manifest exactly as a storage save would and records
//   it, with every file's holders, in the MemoryCatalog.
// - MemoryLoadKind plans an exchange-based load from the catalog's manifest, each stored
//   piece read by a rank whose worker still holds its file (any target layout); a file with no
//   copy left, or none on this load's workers, is refused naming the checkpoint, the tensors
//   and the workers/hosts that held it.
// No gRPC, no logging.
#ifndef CKPT_COORDINATOR_MEMORY_KINDS_H_
#define CKPT_COORDINATOR_MEMORY_KINDS_H_

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "coordinator/load_exchange.h"
#include "coordinator/memory_catalog.h"
#include "coordinator/operation_kind.h"

namespace ckpt::coordinator {

// For each rank of `op`, `replicas` other ranks whose workers are on another host than the
// rank's (and distinct workers), spread round-robin. FailedPrecondition naming the
// checkpoint, the rank and its host when too few such workers take part in the operation.
absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(const Operation& op, int replicas);

// Memory saves. Thread-safe.
class MemorySaveKind final : public OperationKindHandler {
 public:
  // `catalog` must outlive this; `replicas`: extra copies of every file (0: none);
  // `keep_newest`: memory checkpoints kept, by the catalog and every worker (0: unbounded
  // here, the workers' --memory_tier_keep there).
  MemorySaveKind(MemoryCatalog* catalog, int replicas, int keep_newest = 0)
      : catalog_(catalog), replicas_(replicas), keep_newest_(keep_newest) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  // Plan of a save whose checkpoint counts in retention `group` (memory_catalog.h
  // RetentionGroup): keep-newest evicts only the group's older checkpoints.
  absl::StatusOr<std::vector<RankPlan>> PlanInGroup(const Operation& op, const std::string& group);
  absl::Status Commit(Operation& op) override;
  // Commit of a publish: the checkpoint is recorded as version `published_version` of
  // transfer name `published_name` (kept in the holders' records, see MemoryCheckpoint).
  absl::Status CommitPublished(const Operation& op, const std::string& published_name,
                               int64_t published_version);
  absl::Status Finalize(const Operation& op) override;

 private:
  MemoryCatalog* catalog_;
  int replicas_;
  int keep_newest_;
  std::mutex mu_;
  std::map<std::string, std::vector<std::vector<int>>> placement_;  // op -> replica ranks
};

// Memory loads.
class MemoryLoadKind final : public OperationKindHandler {
 public:
  MemoryLoadKind(const MemoryCatalog* catalog, LoadPlannerOptions defaults)
      : catalog_(catalog), defaults_(defaults) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  absl::Status Commit(Operation& op) override;
  absl::Status Finalize(const Operation&) override { return absl::OkStatus(); }

 private:
  const MemoryCatalog* catalog_;
  LoadPlannerOptions defaults_;
};

// Routes each operation to `matching` when `matches(op.path)` (e.g. IsMemoryPath: mem://...,
// IsTransferPath: xfer://...), else to `others`.
class PathDispatchKind final : public OperationKindHandler {
 public:
  using PathTest = bool (*)(absl::string_view path);
  PathDispatchKind(PathTest matches, OperationKindHandler* matching, OperationKindHandler* others)
      : matches_(matches), matching_(matching), others_(others) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  absl::Status Prepare(const Operation& op) override;
  std::optional<std::vector<RankPlan>> ReusedPlan(const Operation& op) override;
  absl::Status Commit(Operation& op) override;
  absl::Status Finalize(const Operation& op) override;

 private:
  OperationKindHandler* For(const Operation& op) const;
  PathTest matches_;
  OperationKindHandler* matching_;
  OperationKindHandler* others_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_MEMORY_KINDS_H_
