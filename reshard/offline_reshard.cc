#include "reshard/offline_reshard.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "reshard/piece_assembler.h"
#include "sharding/reshard_plan.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/overwrite_guard.h"

namespace ckpt {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Refuses a too-small budget and a destination that may not be replaced, before any work
// (overwriting replaces only a committed checkpoint; the commit checks again).
absl::Status ValidateRequest(const std::string& dst, const OfflineReshardOptions& options) {
  if (options.memory_budget_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("memory budget of ", options.memory_budget_bytes,
                                                   " bytes is too small (at least 1 MiB)"));
  }
  if (!options.overwrite && PathExists(dst)) {
    return absl::AlreadyExistsError(
        absl::StrCat(dst, " already exists; pass the overwrite flag to replace it"));
  }
  if (options.overwrite) CKPT_RETURN_IF_ERROR(CheckReplaceable(dst).status());
  return absl::OkStatus();
}

// The destination's save plan: the layout's pieces, one writer per distinct piece, re-packed
// into waves of `share` bytes. Errors name the target layout or the budget.
absl::StatusOr<SavePlan> PlanDestination(const LayoutSpec& layout,
                                         const std::vector<TensorMeta>& tensors, int64_t share,
                                         const OfflineReshardOptions& options) {
  absl::StatusOr<std::vector<TensorPiece>> layout_pieces =
      layout.AllPieces(tensors, /*drop_empty=*/true);
  if (!layout_pieces.ok()) {
    return absl::Status(layout_pieces.status().code(),
                        absl::StrCat("target layout: ", layout_pieces.status().message()));
  }
  SavePlanOptions sp_options;  // its file packing is replaced by RepackForWaves below
  sp_options.groups = layout.process_groups();  // writes distributed within the layout's groups
  absl::StatusOr<SavePlan> save_plan =
      BuildSavePlan(*layout_pieces, layout.world_size(), sp_options);
  if (!save_plan.ok()) {
    return absl::Status(save_plan.status().code(),
                        absl::StrCat("target layout: ", save_plan.status().message()));
  }
  absl::StatusOr<int64_t> waves = RepackForWaves(&*save_plan, share);
  if (!waves.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory budget of ", options.memory_budget_bytes,
        " bytes is too small: ", waves.status().message(), "; use a budget of at least ",
        options.memory_budget_bytes / share, " times that piece"));
  }
  return save_plan;
}

// The save plan's pieces as reshard destinations, and each planned piece's index among them.
std::vector<TensorPiece> DestinationPieces(const SavePlan& save_plan,
                                           std::map<const PlannedPiece*, int64_t>* dst_index) {
  std::vector<TensorPiece> dst_pieces;
  for (const WriterPlan& w : save_plan.writers) {
    for (const PlannedFile& f : w.files) {
      for (const PlannedPiece& p : f.pieces) {
        (*dst_index)[&p] = static_cast<int64_t>(dst_pieces.size());
        dst_pieces.push_back(TensorPiece{p.key, w.rank, p.dtype, p.global_shape, p.region, {}});
      }
    }
  }
  return dst_pieces;
}

// What the destination's manifest keeps from the source: the new layout, step and user metadata.
absl::StatusOr<CheckpointContents> DestinationContents(const pb::Manifest& manifest,
                                                       const LayoutSpec& layout,
                                                       const std::vector<TensorMeta>& tensors) {
  CheckpointContents info;
  CKPT_ASSIGN_OR_RETURN(info.saved_layout, layout.ToSavedLayout(tensors));
  info.step = manifest.step();
  info.user_metadata.insert(manifest.user_metadata().begin(), manifest.user_metadata().end());
  return info;
}

}  // namespace

absl::StatusOr<OfflineReshardStats> OfflineReshard(const std::string& src, const std::string& dst,
                                                   const LayoutSpec& layout,
                                                   const OfflineReshardOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(ValidateRequest(dst, options));
  ReaderOptions ropts;
  ropts.io = options.io;
  ropts.verify_checksums = options.verify_checksums;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(src, ropts));
  const pb::Manifest& manifest = reader->manifest();

  OfflineReshardStats stats;
  CKPT_ASSIGN_OR_RETURN(SourcePieces source, PiecesOfManifest(manifest));
  const std::vector<TensorMeta>& tensors = source.tensors;
  std::vector<TensorMeta> specs;
  for (const TensorMeta& t : tensors) specs.push_back({t.key, t.dtype, t.global_shape});
  stats.tensors = static_cast<int64_t>(tensors.size());
  const std::vector<TensorPiece>& src_pieces = source.pieces;
  stats.src_pieces = static_cast<int64_t>(src_pieces.size());

  // Budget: one share per destination wave in memory (two when overlapped) plus one for
  // source staging.
  const int64_t share = options.memory_budget_bytes / (options.overlap ? 3 : 2);
  CKPT_ASSIGN_OR_RETURN(SavePlan save_plan, PlanDestination(layout, tensors, share, options));
  std::map<const PlannedPiece*, int64_t> dst_index;
  const std::vector<TensorPiece> dst_pieces = DestinationPieces(save_plan, &dst_index);
  stats.dst_pieces = static_cast<int64_t>(dst_pieces.size());
  ReshardPlanOptions rp_options;
  rp_options.prefer_local = false;
  absl::StatusOr<ReshardPlan> plan = PlanReshard(src_pieces, dst_pieces, rp_options);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("planning the reshard of ", src, ": ",
                                                           plan.status().message()));
  }
  stats.plan_seconds = SecondsSince(t_start);
  CKPT_ASSIGN_OR_RETURN(CheckpointContents info, DestinationContents(manifest, layout, tensors));

  PieceAssembler assembler(*reader, src_pieces, dst_pieces, *plan, share, options.overlap);
  WriteOptions wopts;
  wopts.io = options.io;
  wopts.overwrite = options.overwrite;
  wopts.compression = options.compression;
  wopts.checksum_block_bytes = manifest.checksum_block_bytes() > 0 ? manifest.checksum_block_bytes()
                                                                   : kDefaultChecksumBlockBytes;
  WaveOptions wave;
  wave.wave_bytes = share;
  wave.overlap = options.overlap;
  wave.progress = options.progress;
  auto fill = [&](absl::Span<const PlannedPiece* const> pieces,
                  absl::Span<char* const> buffers) -> absl::Status {
    std::vector<int64_t> indices;
    indices.reserve(pieces.size());
    for (const PlannedPiece* p : pieces) {
      auto it = dst_index.find(p);
      if (it == dst_index.end()) {
        return absl::InternalError(absl::StrCat("tensor \"", p->key, "\" piece ",
                                                p->region.DebugString(), " is not in the plan"));
      }
      indices.push_back(it->second);
    }
    return assembler.Fill(indices, buffers);
  };
  absl::StatusOr<WaveWriteStats> written =
      WriteCheckpointInWaves(dst, specs, save_plan, info, fill, wave, wopts);
  stats.bytes_read = assembler.stats().bytes_read;
  stats.read_seconds = assembler.stats().read_seconds;
  stats.peak_staging_bytes = assembler.stats().peak_staging_bytes;
  if (!written.ok()) return written.status();
  stats.write = *written;
  return stats;
}

}  // namespace ckpt
