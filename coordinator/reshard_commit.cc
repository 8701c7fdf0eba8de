#include "coordinator/reshard_commit.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "coordinator/save_commit.h"
#include "planner/save_plan.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "reshard/piece_assembler.h"
#include "sharding/piece_id.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"

namespace ckpt::coordinator {
namespace {

// How long one store request of a reshard to an object store may take.
constexpr absl::Duration kStoreTimeout = absl::Minutes(10);

std::string Normalized(const std::string& path) {
  return std::filesystem::absolute(std::filesystem::path(path)).lexically_normal().string();
}

}  // namespace

absl::StatusOr<std::vector<RankPlan>> PlanClusterReshard(const pb::Manifest& source_manifest,
                                                         const std::string& source,
                                                         const LayoutSpec& layout,
                                                         int64_t memory_budget_bytes,
                                                         const std::string& staging_dir) {
  if (memory_budget_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("reshard memory budget of ", memory_budget_bytes,
                                                   " bytes is too small (at least 1 MiB)"));
  }
  CKPT_ASSIGN_OR_RETURN(SourcePieces src, PiecesOfManifest(source_manifest));
  absl::StatusOr<std::vector<TensorPiece>> pieces =
      layout.AllPieces(src.tensors, /*drop_empty=*/true);
  if (!pieces.ok()) return WithContext(pieces.status(), "target layout: ");
  SavePlanOptions save_options;
  save_options.groups = layout.process_groups();  // writes distributed within the layout's groups
  absl::StatusOr<SavePlan> save_plan = BuildSavePlan(*pieces, layout.world_size(), save_options);
  if (!save_plan.ok()) return WithContext(save_plan.status(), "target layout: ");

  // Each writer's pieces in shard-id order, cut into files that fit a wave of its budget.
  const int64_t share = memory_budget_bytes / 3;
  const int64_t file_cap = std::min(kReshardFileBytes, share);
  std::vector<pb::ReshardPlanPart> parts(layout.world_size());
  for (int64_t r = 0; r < layout.world_size(); ++r) {
    parts[r].set_rank(static_cast<int32_t>(r));
    parts[r].set_source(source);
    parts[r].set_staging_dir(staging_dir);
    parts[r].set_memory_budget_bytes(memory_budget_bytes);
  }
  for (WriterPlan& w : save_plan->writers) {
    std::vector<PlannedPiece> mine;
    for (PlannedFile& f : w.files) {
      for (PlannedPiece& p : f.pieces) mine.push_back(std::move(p));
    }
    std::stable_sort(mine.begin(), mine.end(), [](const PlannedPiece& a, const PlannedPiece& b) {
      return PieceIdLess()(PieceId{a.key, a.region.offsets, a.region.flat},
                           PieceId{b.key, b.region.offsets, b.region.flat});
    });
    pb::ReshardPlanPart& part = parts[w.rank];
    pb::PlanFile* file = nullptr;
    for (const PlannedPiece& p : mine) {
      if (p.size_bytes > share) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "tensor \"", p.key, "\" piece ", p.region.DebugString(), " of rank ", w.rank, " has ",
            p.size_bytes, " bytes, more than a third of the reshard memory budget of ",
            memory_budget_bytes, " bytes; use a budget of at least ", 3 * p.size_bytes));
      }
      if (file == nullptr || file->total_bytes() + p.size_bytes > file_cap) {
        file = part.add_files();
        file->set_path(DataFileName(w.rank, int64_t{part.files_size()} - 1));
      }
      pb::PlanPiece* piece = file->add_pieces();
      piece->set_key(p.key);
      piece->set_dtype(DTypeToProto(p.dtype));
      piece->mutable_global_shape()->Add(p.global_shape.begin(), p.global_shape.end());
      *piece->mutable_region() = RegionToProto(p.region);
      piece->set_size_bytes(p.size_bytes);
      file->set_total_bytes(file->total_bytes() + p.size_bytes);
      part.set_total_bytes(part.total_bytes() + p.size_bytes);
    }
  }
  std::vector<RankPlan> plans;
  plans.reserve(parts.size());
  for (const pb::ReshardPlanPart& part : parts) {
    plans.push_back(RankPlan{part.SerializeAsString(), part.total_bytes()});
  }
  return plans;
}

absl::StatusOr<std::vector<RankPlan>> ReshardCommitter::Plan(const Operation& op) {
  // No journal for a store URL: what a crashed coordinator leaves there is `ckptctl gc`'s.
  if (journal_ != nullptr && !IsObjectStoreLocation(op.path)) {
    CKPT_RETURN_IF_ERROR(journal_->Begin(op.id, op.path));
  }
  return PlanJournaled(op);
}

absl::StatusOr<std::vector<RankPlan>> ReshardCommitter::PlanJournaled(const Operation& op) {
  const ReshardSpec& spec = op.reshard;
  if (Normalized(spec.source) == Normalized(op.path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshard ", spec.source, " onto itself: give another destination"));
  }
  absl::StatusOr<LayoutSpec> layout = LayoutSpec::Parse(spec.layout_json);
  if (!layout.ok()) return WithContext(layout.status(), "target layout: ");
  if (layout->world_size() != op.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("target layout has ", layout->world_size(),
                                                   " ranks but ", op.DebugString(), " has ",
                                                   op.world_size));
  }
  // Opening validates the manifest against the data files (names, sizes).
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(spec.source);
  if (!reader.ok()) return WithContext(reader.status(), "source checkpoint: ");
  const pb::Manifest& manifest = (*reader)->manifest();
  Pending pending;
  CKPT_ASSIGN_OR_RETURN(SourcePieces src, PiecesOfManifest(manifest));
  for (const TensorMeta& t : src.tensors) {
    pending.tensors.push_back(TensorMeta{t.key, t.dtype, t.global_shape});
  }
  absl::StatusOr<pb::SavedLayout> saved = layout->ToSavedLayout(src.tensors);
  if (!saved.ok()) return WithContext(saved.status(), "target layout: ");
  pending.info.saved_layout = *std::move(saved);
  pending.info.step = manifest.step();
  pending.info.user_metadata.insert(manifest.user_metadata().begin(),
                                    manifest.user_metadata().end());
  pending.overwrite = spec.overwrite;
  const int64_t budget =
      spec.memory_budget_bytes > 0 ? spec.memory_budget_bytes : kDefaultReshardBudgetBytes;
  const bool store = IsObjectStoreLocation(op.path);
  absl::StatusOr<std::string> staging =
      store ? store_writes_.Begin(op.id, op.path, spec.overwrite, absl::Now() + kStoreTimeout)
            : CreateStagingDir(op.path, spec.overwrite);
  if (!staging.ok()) return WithContext(staging.status(), "destination: ");
  pending.staging = *staging;
  absl::StatusOr<std::vector<RankPlan>> plans =
      PlanClusterReshard(manifest, spec.source, *layout, budget, *staging);
  if (!plans.ok()) {
    (void)(store ? store_writes_.Abort(op.id, absl::Now() + kStoreTimeout) : RemoveTree(*staging));
    return plans.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  pending_[op.id] = std::move(pending);
  return plans;
}

absl::Status ReshardCommitter::Commit(Operation& op) {
  Pending pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(op.id);
    if (it == pending_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(op.DebugString(), " has no staging dir"));
    }
    pending = it->second;
  }
  CKPT_ASSIGN_OR_RETURN(WrittenData data, MergeWrittenRecords(op));
  const pb::Manifest manifest =
      BuildManifest(pending.tensors, data, pending.info, kDefaultChecksumBlockBytes);
  WriteOptions options;
  options.overwrite = pending.overwrite;
  absl::Status committed = IsObjectStoreLocation(op.path)
                               ? store_writes_.Commit(op.id, manifest, absl::Now() + kStoreTimeout)
                               : CommitCheckpoint(pending.staging, op.path, manifest, options);
  if (committed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(op.id);
  }
  return committed;
}

absl::Status ReshardCommitter::Finalize(const Operation& op) {
  std::string staging;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(op.id);
    if (it != pending_.end()) {
      staging = it->second.staging;
      pending_.erase(it);
    }
  }
  absl::Status discarded = staging.empty() || op.phase == Phase::kDone ? absl::OkStatus()
                           : IsObjectStoreLocation(op.path)
                               ? store_writes_.Abort(op.id, absl::Now() + kStoreTimeout)
                               : DiscardStagingDir(staging);
  absl::Status ended = journal_ != nullptr ? journal_->End(op.id) : absl::OkStatus();
  return discarded.ok() ? ended : discarded;
}

}  // namespace ckpt::coordinator
