// The coordinator's side of a distributed save on a shared filesystem (or, for a store URL
// such as s3://bucket/name, into a checkpoint store: coordinator/store_writes.h): before the plan
// goes out it creates the checkpoint's staging directory (workers write their data files there);
// once every rank reported what it wrote it merges those records into the manifest and runs
// the storage commit protocol (fsyncs, atomic rename); an aborted save's staging directory is
// removed, so nothing half-written ever looks like a checkpoint. No gRPC, no logging.
#ifndef CKPT_COORDINATOR_SAVE_COMMIT_H_
#define CKPT_COORDINATOR_SAVE_COMMIT_H_

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "coordinator/operation_kind.h"
#include "coordinator/save_plan_reuse.h"
#include "coordinator/staging_journal.h"
#include "coordinator/store_writes.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_writer.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"

namespace ckpt::coordinator {

// The pieces and files of every rank's `written` record (a serialized pb::Manifest holding
// what that rank wrote), in rank order. DataLoss naming the rank for an unreadable record.
absl::StatusOr<WrittenData> MergeWrittenRecords(const Operation& op);

// Merges the ranks' `written` records (serialized pb::Manifest with pieces and files) with the
// gathered tensor metadata into the checkpoint's manifest. Errors name the rank.
absl::StatusOr<pb::Manifest> MergeManifest(const Operation& op);

// The save kind: tracks the staging directory of each save in flight. Thread-safe.
class SaveCommitter final : public OperationKindHandler {
 public:
  // `journal` (may be null; must outlive this) records each save's final path before its
  // staging directory is created, so a restarted coordinator can clean up after it. A manifest
  // too large for one file is committed in piece files as `manifest_files` says
  // (storage/manifest_file.h; small budgets in tests).
  explicit SaveCommitter(StagingJournal* journal = nullptr,
                         ManifestFileOptions manifest_files = ManifestFileOptions())
      : journal_(journal), manifest_files_(manifest_files) {}

  // Journals op.path and creates the staging directory next to it (AlreadyExists when a
  // checkpoint is there, unless op.overwrite: then only what is not a committed checkpoint or
  // an empty directory is refused, FailedPrecondition naming it).
  absl::Status Prepare(const Operation& op) override;
  // The job's kept plan (SavePlanReuse) naming the staging directory Prepare made, when every
  // rank's description is the one it was planned for; nullopt also when Prepare was not called.
  std::optional<std::vector<RankPlan>> ReusedPlan(const Operation& op) override;
  // Prepares (unless Prepare was called) and plans: the kept plan when ReusedPlan would give
  // it, else PlanSave's (kept for the next save).
  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  // Commits the staging directory to op.path with the manifest merged from the ranks' written
  // records, streamed into its file (or piece files) and validated as it goes (never one
  // message in memory). With op.overwrite a committed checkpoint there is swapped out in one
  // rename and then removed (storage/checkpoint_writer.h CommitStreamedCheckpoint).
  // Consumes the records (op.ranks[r].written is empty afterwards): each is freed once written.
  absl::Status Commit(Operation& op) override;
  // Removes the staging directory of a save that did not commit; ends its journal entry.
  absl::Status Finalize(const Operation& op) override;

  // How many commits skipped the manifest's full validation because its shape
  // (ManifestShapeOf) was that of the job's last committed manifest.
  int validations_reused() const;

 private:
  std::string StagingDir(const std::string& operation_id);
  // Commit of a save to a store URL (StoreWrites): the merged manifest, committed by the store.
  absl::Status CommitToStore(Operation& op);
  // Whether `shape` is that of the last manifest `job` committed (which passed validation).
  bool ShapeValidatedBefore(const std::string& job, const ManifestShape& shape);

  StagingJournal* journal_;
  const ManifestFileOptions manifest_files_;
  StoreWrites store_writes_;  // saves to a store URL (s3://...): their writes
  SavePlanReuse plan_reuse_;  // the job's last plan, for a repeat save of unchanged ranks
  mutable std::mutex mu_;
  std::map<std::string, std::string> staging_ ABSL_GUARDED_BY(mu_);  // operation -> dir
  // job -> the shape of the last manifest it committed (which passed ValidateManifest).
  std::map<std::string, ManifestShape> committed_shapes_ ABSL_GUARDED_BY(mu_);
  int validations_reused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SAVE_COMMIT_H_
