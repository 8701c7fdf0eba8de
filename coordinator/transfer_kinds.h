// Live transfer between jobs (issue 17): the operation kinds of xfer:// paths.
//
// - PublishKind: a save to "xfer://<name>[@<version>]" publishes the source job's state as the
//   next (or the given) version. It is planned and committed exactly as a memory save
//   (MemorySaveKind) of the memory checkpoint "<name>.v<version>" with no replicas by default:
//   each source worker keeps its rank's files in its own memory tier, so the trainer goes on as
//   soon as its bytes left its memory (the save's snapshot). The commit records the version in
//   the PublishedRegistry, which lists the newest K versions per name.
// - ReceiveKind: a load of "xfer://<name>[@<version>][?verify]" fills the destination job's
//   tensors with the newest (or the given) version, in any layout. The published files are
//   held by workers of ANOTHER job, so the receive adds them as serving participants: one
//   extra exchange rank per holder worker (ranks world_size.. of the operation, see
//   RankPlan::serving), with no requests, whose work items (OPERATION_RECEIVE) make those
//   workers read their units from their memory tier and send them over the data plane
//   straight to the destination's workers. The plan is kept per (source layout, destination
//   layout) pair (TransferPlanCache) and reused for later versions, patched with what changes.
//   "?verify": every received byte is checked against checksums the readers computed from
//   checksum-verified stored bytes (worker/load_exchange_executor.h).
// - PathDispatchKind (memory_kinds.h) with IsTransferPath routes xfer:// paths to these kinds.
// No gRPC, no logging.
#ifndef CKPT_COORDINATOR_TRANSFER_KINDS_H_
#define CKPT_COORDINATOR_TRANSFER_KINDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "coordinator/load_exchange.h"
#include "coordinator/memory_catalog.h"
#include "coordinator/memory_kinds.h"
#include "coordinator/operation_kind.h"
#include "coordinator/transfer_plan_cache.h"
#include "coordinator/transfer_registry.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

// The registry's names and versions with their bytes and holders from `catalog` (may be null),
// for GetStatus / `ckptctl transfer list`.
void PublishedToProto(const PublishedRegistry& registry, const MemoryCatalog* catalog,
                      google::protobuf::RepeatedPtrField<pb::PublishedStatus>* out);

// Publishes. Thread-safe.
class PublishKind final : public OperationKindHandler {
 public:
  // `catalog` and `registry` must outlive this.
  // The source workers keep the registry's newest K versions of each name (retention group
  // "xfer:<name>"), besides whatever else their memory tiers hold.
  PublishKind(MemoryCatalog* catalog, PublishedRegistry* registry)
      : registry_(registry), memory_(catalog, /*replicas=*/0, registry->keep_versions()) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  absl::Status Commit(Operation& op) override;
  absl::Status Finalize(const Operation& op) override;

 private:
  // `op` as the memory save of its reserved version (path mem://<name>.v<version>).
  absl::StatusOr<Operation> AsMemorySave(const Operation& op) const;

  PublishedRegistry* registry_;
  MemorySaveKind memory_;
};

// Receives. Thread-safe.
class ReceiveKind final : public OperationKindHandler {
 public:
  ReceiveKind(const MemoryCatalog* catalog, const PublishedRegistry* registry,
              LoadPlannerOptions defaults, TransferPlanCache* cache)
      : catalog_(catalog), registry_(registry), defaults_(defaults), cache_(cache) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  // A receive never reaches committing (it ends done once every rank reported).
  absl::Status Commit(Operation& op) override;
  absl::Status Finalize(const Operation&) override { return absl::OkStatus(); }

 private:
  const MemoryCatalog* catalog_;
  const PublishedRegistry* registry_;
  LoadPlannerOptions defaults_;
  TransferPlanCache* cache_;
};

// Memory loads (mem://<name>) whose files are held only by workers outside the load's ranks:
// those holders become serving participants exactly as for a receive (the files stay where
// they are; no copy is made). Loads whose every file has a holder among the load's workers,
// and files with no copy left, go to `memory_loads` unchanged (its plan and its refusals).
class ServedMemoryLoadKind final : public OperationKindHandler {
 public:
  ServedMemoryLoadKind(const MemoryCatalog* catalog, OperationKindHandler* memory_loads,
                       LoadPlannerOptions defaults)
      : catalog_(catalog), memory_loads_(memory_loads), defaults_(defaults) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  absl::Status Commit(Operation& op) override { return memory_loads_->Commit(op); }
  absl::Status Finalize(const Operation& op) override { return memory_loads_->Finalize(op); }

 private:
  const MemoryCatalog* catalog_;
  OperationKindHandler* memory_loads_;
  LoadPlannerOptions defaults_;
};

// Everything live transfer adds to a coordinator, built together (the daemon keeps one).
struct TransferKinds {
  // `catalog` and `memory_loads` must outlive this; `keep_versions` per published name.
  TransferKinds(MemoryCatalog* catalog, OperationKindHandler* memory_loads,
                LoadPlannerOptions load_defaults, int keep_versions)
      : published(keep_versions),
        publishes(catalog, &published),
        receives(catalog, &published, load_defaults, &plans),
        served_memory_loads(catalog, memory_loads, load_defaults) {}

  PublishedRegistry published;
  TransferPlanCache plans;
  PublishKind publishes;
  ReceiveKind receives;
  ServedMemoryLoadKind served_memory_loads;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_TRANSFER_KINDS_H_
