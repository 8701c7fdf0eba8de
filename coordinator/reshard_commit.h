// The coordinator's side of a reshard executed on the cluster's workers (ckptctl reshard
// --coordinator): planning reads the source checkpoint's manifest, expands the target layout
// into pieces, picks one writer per distinct main-replica piece (the save planner), cuts each
// writer's pieces into files that fit its memory budget and creates the destination's staging
// directory; committing merges the ranks' records of what they wrote with the source's tensors,
// step and user metadata and the target layout into the manifest and runs the storage commit
// protocol (RENAME_EXCHANGE when overwriting). An aborted reshard's staging directory is
// removed, so the destination is never half-written and an earlier checkpoint there stays.
// A destination that is an object-store URL (s3://...) gets a store write instead of the staging
// directory (coordinator/store_writes.h), as a save does. No gRPC, no logging.
#ifndef CKPT_COORDINATOR_RESHARD_COMMIT_H_
#define CKPT_COORDINATOR_RESHARD_COMMIT_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "coordinator/operation_kind.h"
#include "coordinator/staging_journal.h"
#include "coordinator/store_writes.h"
#include "planner/layout_spec.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::coordinator {

// Per-rank memory budget of a reshard when the request gives none.
inline constexpr int64_t kDefaultReshardBudgetBytes = int64_t{1} << 30;
// Largest data file a reshard rank writes.
inline constexpr int64_t kReshardFileBytes = int64_t{256} << 20;

// One plan part per target rank (serialized pb::ReshardPlanPart) for rewriting the checkpoint
// whose manifest is `source_manifest` (at `source`) into `layout`. Each rank holds at most a
// third of `memory_budget_bytes` per file wave (two waves in flight plus source staging), so
// every file holds at most that much; ResourceExhausted names a piece that does not fit.
// Layout errors come back as InvalidArgument naming the tensor and rule.
absl::StatusOr<std::vector<RankPlan>> PlanClusterReshard(const pb::Manifest& source_manifest,
                                                         const std::string& source,
                                                         const LayoutSpec& layout,
                                                         int64_t memory_budget_bytes,
                                                         const std::string& staging_dir);

// The reshard kind: tracks the staging directory and manifest contents of each reshard in
// flight. Thread-safe.
class ReshardCommitter final : public OperationKindHandler {
 public:
  // `journal` (may be null; must outlive this) records each destination before its staging
  // directory is created.
  explicit ReshardCommitter(StagingJournal* journal = nullptr) : journal_(journal) {}

  // For kReshard operations (op.reshard says what to read; op.path is the destination):
  // journals the destination, validates the source checkpoint and the layout (whose world
  // size must be op.world_size), creates the staging directory and plans with
  // PlanClusterReshard. Errors name the source, destination or tensor.
  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  // Manifest from every rank's record, then the commit protocol to op.path.
  absl::Status Commit(Operation& op) override;
  // Removes the staging directory of a reshard that did not commit; ends its journal entry.
  absl::Status Finalize(const Operation& op) override;

 private:
  absl::StatusOr<std::vector<RankPlan>> PlanJournaled(const Operation& op);

  StagingJournal* journal_;
  // What the commit needs besides the ranks' records.
  struct Pending {
    std::string staging;
    std::vector<TensorMeta> tensors;
    CheckpointContents info;  // saved layout, step, user metadata
    int64_t checksum_block_bytes = 0;
    bool overwrite = false;
  };

  StoreWrites store_writes_;  // reshards to a store URL (s3://...): their writes
  std::mutex mu_;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);  // operation -> state
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_RESHARD_COMMIT_H_
