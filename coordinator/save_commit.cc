#include "coordinator/save_commit.h"

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/operation_planners.h"
#include "proto/convert.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"

namespace ckpt::coordinator {

absl::StatusOr<WrittenData> MergeWrittenRecords(const Operation& op) {
  WrittenData data;
  for (int r = 0; r < op.world_size; ++r) {
    pb::Manifest written;
    if (!written.ParseFromString(op.ranks[r].written)) {
      return absl::DataLossError(
          absl::StrCat("rank ", r, " reported an unreadable record of the files it wrote"));
    }
    for (pb::StoredPiece& p : *written.mutable_pieces()) data.pieces.push_back(std::move(p));
    for (pb::DataFile& f : *written.mutable_files()) data.files.push_back(std::move(f));
  }
  return data;
}

absl::StatusOr<pb::Manifest> MergeManifest(const Operation& op) {
  // Tensors: every key gathered, with the dtype and shape the lowest rank reported.
  std::vector<TensorMeta> tensors;
  std::set<std::string> seen;
  for (int r = 0; r < op.world_size; ++r) {
    for (const pb::PieceMeta& s : op.ranks[r].shards) {
      if (!seen.insert(s.tensor().key()).second) continue;
      absl::StatusOr<DType> dtype = DTypeFromProto(s.tensor().dtype());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", s.tensor().key(), ": ", dtype.status().message()));
      }
      tensors.push_back(TensorMeta{s.tensor().key(), *dtype,
                                   std::vector<int64_t>(s.tensor().global_shape().begin(),
                                                        s.tensor().global_shape().end())});
    }
  }
  absl::StatusOr<WrittenData> data = MergeWrittenRecords(op);
  if (!data.ok()) return data.status();
  CheckpointContents info;
  info.saved_layout.set_world_size(op.world_size);
  // How the tensors were described (lowest rank that described each key), informational.
  std::set<std::string> described;
  for (int r = 0; r < op.world_size; ++r) {
    const RankEntry& e = op.ranks[r];
    if (info.saved_layout.mesh_shape_size() == 0 && !e.mesh_shape.empty()) {
      info.saved_layout.mutable_mesh_shape()->Add(e.mesh_shape.begin(), e.mesh_shape.end());
    }
    for (const pb::TensorLayout& l : e.layouts) {
      if (l.key().empty() || (l.placements_size() == 0 && !l.flat_sharded())) continue;
      if (described.insert(l.key()).second) *info.saved_layout.add_tensors() = l;
    }
  }
  info.user_metadata = op.metadata;
  if (auto step = op.metadata.find("step"); step != op.metadata.end()) {
    if (!absl::SimpleAtoi(step->second, &info.step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata step=\"", step->second, "\" is not an integer"));
    }
  }
  return BuildManifest(tensors, *data, info, kDefaultChecksumBlockBytes);
}

std::string SaveCommitter::StagingDir(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = staging_.find(operation_id);
  return it == staging_.end() ? "" : it->second;
}

absl::StatusOr<std::vector<RankPlan>> SaveCommitter::Plan(const Operation& op) {
  if (journal_ != nullptr) CKPT_RETURN_IF_ERROR(journal_->Begin(op.id, op.path));
  absl::StatusOr<std::string> staging = CreateStagingDir(op.path, /*overwrite=*/false);
  if (!staging.ok()) return staging.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    staging_[op.id] = *staging;
  }
  if (std::optional<std::vector<RankPlan>> reused = plan_reuse_.Find(op, *staging)) {
    return *std::move(reused);
  }
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op, SavePlanOptions(), *staging);
  if (plans.ok()) plan_reuse_.Keep(op, *plans);
  return plans;
}

absl::Status SaveCommitter::Commit(const Operation& op) {
  std::string staging = StagingDir(op.id);
  if (staging.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(op.DebugString(), " has no staging dir"));
  }
  absl::StatusOr<pb::Manifest> manifest = MergeManifest(op);
  if (!manifest.ok()) return manifest.status();
  absl::Status committed = CommitCheckpoint(staging, op.path, *manifest, WriteOptions());
  if (committed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    staging_.erase(op.id);
  }
  return committed;
}

absl::Status SaveCommitter::Finalize(const Operation& op) {
  std::string staging;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = staging_.find(op.id);
    if (it != staging_.end()) {
      staging = it->second;
      staging_.erase(it);
    }
  }
  absl::Status discarded =
      staging.empty() || op.phase == Phase::kDone ? absl::OkStatus() : DiscardStagingDir(staging);
  absl::Status ended = journal_ != nullptr ? journal_->End(op.id) : absl::OkStatus();
  return discarded.ok() ? ended : discarded;
}

}  // namespace ckpt::coordinator
