#include "coordinator/save_commit.h"

#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "coordinator/operation_planners.h"
#include "coordinator/store_writes.h"
#include "google/protobuf/arena.h"
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

namespace {

// Every key gathered, with the dtype and shape the lowest rank reported.
absl::StatusOr<std::vector<TensorMeta>> GatheredTensors(const Operation& op) {
  std::vector<TensorMeta> tensors;
  absl::flat_hash_set<absl::string_view> seen;  // keys point into op's shared piece lists
  // Ranks sharing a piece list describe the same tensors: each list is read once.
  absl::flat_hash_set<const SharedPieceList*> lists_read;
  for (int r = 0; r < op.world_size; ++r) {
    const RankPieces& shards = op.ranks[r].shards;
    if (!lists_read.insert(shards.list()).second) continue;
    for (int i = 0; i < shards.size(); ++i) {
      const pb::TensorMeta& t = shards.tensor(i);
      if (!seen.insert(t.key()).second) continue;
      absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", t.key(), ": ", dtype.status().message()));
      }
      tensors.push_back(TensorMeta{
          t.key(), *dtype, std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end())});
    }
  }
  return tensors;
}

// The saved layout (how the lowest rank that described each key described it,
// informational), the user metadata and the step.
absl::StatusOr<CheckpointContents> SavedContents(const Operation& op) {
  CheckpointContents info;
  info.saved_layout.set_world_size(op.world_size);
  absl::flat_hash_set<absl::string_view> described;
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
  return info;
}

// Moves every element of `from` to the end of `to` (both on the same arena, or both on none)
// without copying: ownership of the element objects passes from one field to the other.
template <typename T>
void MoveElements(google::protobuf::RepeatedPtrField<T>* from,
                  google::protobuf::RepeatedPtrField<T>* to) {
  std::vector<T*> moved(from->size());
  from->UnsafeArenaExtractSubrange(0, from->size(), moved.data());
  to->Reserve(to->size() + static_cast<int>(moved.size()));
  for (T* element : moved) to->UnsafeArenaAddAllocated(element);
}

// Parses rank `rank`'s `record` on m's arena and moves its pieces and files to the end of `m`
// (no copy). DataLoss names the rank.
absl::Status AppendWrittenRecord(int rank, const std::string& record, pb::Manifest* m) {
  google::protobuf::Arena* arena = m->GetArena();
  std::unique_ptr<pb::Manifest> owned;
  pb::Manifest* written = arena != nullptr
                              ? google::protobuf::Arena::CreateMessage<pb::Manifest>(arena)
                              : (owned = std::make_unique<pb::Manifest>()).get();
  if (!written->ParseFromString(record)) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, " reported an unreadable record of the files it wrote"));
  }
  MoveElements(written->mutable_pieces(), m->mutable_pieces());
  MoveElements(written->mutable_files(), m->mutable_files());
  return absl::OkStatus();
}

// MergeManifest, building the manifest on `arena` (null: on the heap, owned by the caller);
// `append_records` appends the ranks' written records, in rank order (AppendWrittenRecord).
absl::StatusOr<pb::Manifest*> MergeManifestOn(
    const Operation& op, google::protobuf::Arena* arena,
    absl::FunctionRef<absl::Status(pb::Manifest*)> append_records) {
  CKPT_ASSIGN_OR_RETURN(std::vector<TensorMeta> tensors, GatheredTensors(op));
  std::unique_ptr<pb::Manifest> owned;
  pb::Manifest* m = arena != nullptr ? google::protobuf::Arena::CreateMessage<pb::Manifest>(arena)
                                     : (owned = std::make_unique<pb::Manifest>()).get();
  CKPT_RETURN_IF_ERROR(append_records(m));
  CKPT_ASSIGN_OR_RETURN(CheckpointContents info, SavedContents(op));
  // Everything but the pieces and files, as BuildManifest makes it; merged in, it sets the
  // same fields (the pieces and files are already there, in the same order).
  m->MergeFrom(BuildManifest(tensors, WrittenData(), info, kDefaultChecksumBlockBytes));
  owned.release();
  return m;
}

// The records are merged as the manifest is streamed into its file, never into one message:
// a first pass over the ranks' records collects their data files (the manifest's head is
// everything but its pieces) and hashes their pieces (its shape); a second pass parses each
// record again, checks its pieces, writes them and frees the record.

// Parses rank `rank`'s written record onto `arena`. DataLoss names the rank.
absl::StatusOr<pb::Manifest*> ParseWrittenRecord(int rank, const std::string& record,
                                                 google::protobuf::Arena* arena) {
  pb::Manifest* written = google::protobuf::Arena::CreateMessage<pb::Manifest>(arena);
  if (!written->ParseFromString(record)) {
    return absl::DataLossError(
        absl::StrCat("rank ", rank, " reported an unreadable record of the files it wrote"));
  }
  return written;
}

// The manifest of `op` without its pieces (the data files of every rank's record in rank
// order included), as MergeManifest makes it; `pieces` hashes the records' pieces in order,
// `*num_pieces` counts them and `*pieces_bytes` adds up their PieceRecordBytes.
absl::StatusOr<pb::Manifest> ManifestHead(const Operation& op, PieceShapeHasher* pieces,
                                          int* num_pieces, int64_t* pieces_bytes) {
  CKPT_ASSIGN_OR_RETURN(std::vector<TensorMeta> tensors, GatheredTensors(op));
  google::protobuf::RepeatedPtrField<pb::DataFile> files;
  *num_pieces = 0;
  *pieces_bytes = 0;
  google::protobuf::Arena arena;  // one record at a time
  for (int r = 0; r < op.world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(pb::Manifest * written,
                          ParseWrittenRecord(r, op.ranks[r].written, &arena));
    for (const pb::StoredPiece& p : written->pieces()) {
      pieces->Add(p);
      *pieces_bytes += PieceRecordBytes(p);
    }
    *num_pieces += written->pieces_size();
    for (const pb::DataFile& f : written->files()) *files.Add() = f;
    arena.Reset();
  }
  CKPT_ASSIGN_OR_RETURN(CheckpointContents info, SavedContents(op));
  pb::Manifest head = BuildManifest(tensors, WrittenData(), info, kDefaultChecksumBlockBytes);
  head.mutable_files()->Swap(&files);
  return head;
}

// Hands each rank's pieces, in rank order, to `sink` (the record parsed again, each piece
// passed to `check` first; the record freed once its pieces are handed over).
absl::Status StreamPieces(Operation& op,
                          absl::FunctionRef<absl::Status(const pb::StoredPiece&)> check,
                          ManifestPieceSink sink) {
  google::protobuf::Arena arena;  // one record at a time
  for (int r = 0; r < op.world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(pb::Manifest * written,
                          ParseWrittenRecord(r, op.ranks[r].written, &arena));
    for (const pb::StoredPiece& p : written->pieces()) {
      CKPT_RETURN_IF_ERROR(check(p));
      CKPT_RETURN_IF_ERROR(sink(p));
    }
    std::string().swap(op.ranks[r].written);  // frees the buffer (clear() would keep it)
    arena.Reset();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<pb::Manifest> MergeManifest(const Operation& op) {
  CKPT_ASSIGN_OR_RETURN(pb::Manifest * merged, MergeManifestOn(op, nullptr, [&](pb::Manifest* m) {
                          for (int r = 0; r < op.world_size; ++r) {
                            CKPT_RETURN_IF_ERROR(AppendWrittenRecord(r, op.ranks[r].written, m));
                          }
                          return absl::OkStatus();
                        }));
  std::unique_ptr<pb::Manifest> owned(merged);
  return std::move(*owned);
}

std::string SaveCommitter::StagingDir(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = staging_.find(operation_id);
  return it == staging_.end() ? "" : it->second;
}

namespace {

// The deadline of a store request made for `op`: its phase's, or an hour when it has none.
absl::Time StoreDeadline(const Operation& op) {
  return op.deadline == absl::InfiniteFuture() ? absl::Now() + absl::Hours(1) : op.deadline;
}

}  // namespace

absl::Status SaveCommitter::Prepare(const Operation& op) {
  if (!StagingDir(op.id).empty()) return absl::OkStatus();  // prepared before
  if (IsObjectStoreLocation(op.path)) {
    // No journal: what a crashed coordinator leaves in an object store is `ckptctl gc`'s.
    absl::StatusOr<std::string> staging =
        store_writes_.Begin(op.id, op.path, op.overwrite, StoreDeadline(op));
    if (!staging.ok()) return staging.status();
    std::lock_guard<std::mutex> lock(mu_);
    staging_[op.id] = *staging;
    return absl::OkStatus();
  }
  if (journal_ != nullptr) CKPT_RETURN_IF_ERROR(journal_->Begin(op.id, op.path));
  // With op.overwrite a committed checkpoint at the path is accepted here (anything else is
  // FailedPrecondition naming it) and swapped out atomically at the commit.
  absl::StatusOr<std::string> staging = CreateStagingDir(op.path, op.overwrite);
  if (!staging.ok()) return staging.status();
  std::lock_guard<std::mutex> lock(mu_);
  staging_[op.id] = *staging;
  return absl::OkStatus();
}

std::optional<std::vector<RankPlan>> SaveCommitter::ReusedPlan(const Operation& op) {
  const std::string staging = StagingDir(op.id);
  if (staging.empty()) return std::nullopt;
  std::optional<std::vector<RankPlan>> reused = plan_reuse_.Find(op, staging);
  // Kept without the compression tail: this save's own spec goes on (the advancer calls this
  // directly, before Plan).
  if (reused.has_value()) AddCompressionTail(op.compression, &*reused);
  return reused;
}

absl::StatusOr<std::vector<RankPlan>> SaveCommitter::Plan(const Operation& op) {
  CKPT_RETURN_IF_ERROR(Prepare(op));
  if (std::optional<std::vector<RankPlan>> reused = ReusedPlan(op)) return *std::move(reused);
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op, SavePlanOptions(), StagingDir(op.id));
  if (plans.ok()) plan_reuse_.Keep(op, &*plans);  // kept without the compression tail
  if (plans.ok()) AddCompressionTail(op.compression, &*plans);
  return plans;
}

bool SaveCommitter::ShapeValidatedBefore(const std::string& job, const ManifestShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  auto last = committed_shapes_.find(job);
  return last != committed_shapes_.end() && last->second == shape;
}

absl::Status SaveCommitter::CommitToStore(Operation& op) {
  absl::StatusOr<pb::Manifest> manifest = MergeManifest(op);
  if (!manifest.ok()) return manifest.status();
  for (int r = 0; r < op.world_size; ++r) std::string().swap(op.ranks[r].written);
  CKPT_RETURN_IF_ERROR(store_writes_.Commit(op.id, *manifest, StoreDeadline(op)));
  std::lock_guard<std::mutex> lock(mu_);
  staging_.erase(op.id);
  return absl::OkStatus();
}

absl::Status SaveCommitter::Commit(Operation& op) {
  std::string staging = StagingDir(op.id);
  if (staging.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(op.DebugString(), " has no staging dir"));
  }
  if (IsObjectStoreLocation(op.path)) return CommitToStore(op);
  PieceShapeHasher hasher;
  int num_pieces = 0;
  int64_t pieces_bytes = 0;
  CKPT_ASSIGN_OR_RETURN(const pb::Manifest head,
                        ManifestHead(op, &hasher, &num_pieces, &pieces_bytes));
  // A repeat save of an unchanged layout commits a manifest of the same shape as the job's
  // last one, which passed ValidateManifest: only the pieces' own checksums are new. The shape
  // is of the merged manifest (format 1, whether or not it is then stored in piece files: the
  // split is the writer's and changes nothing ValidateManifest checks).
  const ManifestShape shape = hasher.Of(head);
  const bool validated = ShapeValidatedBefore(op.job, shape);
  ManifestValidator validator;
  if (!validated) {
    CKPT_RETURN_IF_ERROR(validator.Start(head));
    validator.Reserve(num_pieces);
  }
  int piece = 0;
  auto check = [&](const pb::StoredPiece& p) {
    return validated ? CheckStoredPieceChecksums(piece++, p) : validator.AddPiece(p);
  };
  WriteOptions options;
  options.manifest_files = manifest_files_;
  options.overwrite = op.overwrite;  // checked again right before the swap (CheckReplaceable)
  absl::Status committed = CommitStreamedCheckpoint(
      staging, op.path, head, pieces_bytes,
      [&](ManifestPieceSink sink) {
        CKPT_RETURN_IF_ERROR(StreamPieces(op, check, sink));
        return validated ? absl::OkStatus() : validator.Finish();
      },
      options);
  if (committed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    staging_.erase(op.id);
    committed_shapes_[op.job] = shape;
    if (validated) ++validations_reused_;
  }
  return committed;
}

int SaveCommitter::validations_reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return validations_reused_;
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
  absl::Status discarded = staging.empty() || op.phase == Phase::kDone ? absl::OkStatus()
                           : IsObjectStoreLocation(op.path)
                               ? store_writes_.Abort(op.id, absl::Now() + absl::Minutes(5))
                               : DiscardStagingDir(staging);
  absl::Status ended = journal_ != nullptr ? journal_->End(op.id) : absl::OkStatus();
  return discarded.ok() ? ended : discarded;
}

}  // namespace ckpt::coordinator
