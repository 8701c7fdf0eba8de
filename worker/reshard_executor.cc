#include "worker/reshard_executor.h"

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/save_plan.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "reshard/piece_assembler.h"
#include "reshard/wave_writer.h"
#include "sharding/reshard_plan.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::worker {
namespace {

// The part's files as a one-writer save plan, and the destination pieces in the same order.
absl::Status BuildWriterPlan(const pb::ReshardPlanPart& part, SavePlan* plan,
                             std::vector<TensorPiece>* pieces) {
  plan->num_ranks = part.rank() + 1;
  WriterPlan writer;
  writer.rank = part.rank();
  for (int k = 0; k < part.files_size(); ++k) {
    const pb::PlanFile& f = part.files(k);
    if (f.path() != DataFileName(int64_t{part.rank()}, int64_t{k})) {
      return absl::InvalidArgumentError(
          absl::StrCat("file ", k, " of the plan is named ", f.path(), ", expected ",
                       DataFileName(int64_t{part.rank()}, int64_t{k})));
    }
    PlannedFile file;
    file.path = f.path();
    for (const pb::PlanPiece& p : f.pieces()) {
      PlannedPiece piece;
      piece.key = p.key();
      absl::StatusOr<DType> dtype = DTypeFromProto(p.dtype());
      if (!dtype.ok())
        return WithContext(dtype.status(), absl::StrCat("tensor \"", p.key(), "\": "));
      piece.dtype = *dtype;
      piece.global_shape.assign(p.global_shape().begin(), p.global_shape().end());
      absl::StatusOr<Region> region = RegionFromProto(p.region());
      if (!region.ok()) {
        return WithContext(region.status(), absl::StrCat("tensor \"", p.key(), "\": "));
      }
      piece.region = *std::move(region);
      piece.size_bytes = p.size_bytes();
      if (piece.size_bytes != piece.region.NumElements() * DTypeSize(piece.dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", p.key(), "\" piece ", piece.region.DebugString(),
                         " declares ", piece.size_bytes, " bytes but holds ",
                         piece.region.NumElements(), " elements of ", DTypeName(piece.dtype)));
      }
      pieces->push_back(
          TensorPiece{piece.key, part.rank(), piece.dtype, piece.global_shape, piece.region, {}});
      file.total_bytes += piece.size_bytes;
      file.pieces.push_back(std::move(piece));
    }
    writer.total_bytes += file.total_bytes;
    writer.files.push_back(std::move(file));
  }
  plan->writers.push_back(std::move(writer));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ExecuteReshardPart(const pb::ReshardPlanPart& part,
                                               const std::function<void(int64_t)>& progress,
                                               const std::function<bool()>& cancelled,
                                               ReshardPartStats* stats) {
  *stats = ReshardPartStats();
  const std::string who = absl::StrCat("reshard rank ", part.rank());
  pb::Manifest record;
  if (part.files_size() == 0) return record.SerializeAsString();
  SavePlan plan;
  std::vector<TensorPiece> dst;
  if (absl::Status s = BuildWriterPlan(part, &plan, &dst); !s.ok()) {
    return WithContext(s, absl::StrCat(who, ": "));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(part.source());
  if (!reader.ok()) {
    return WithContext(reader.status(), absl::StrCat(who, ": source checkpoint: "));
  }
  absl::StatusOr<SourcePieces> src = PiecesOfManifest((*reader)->manifest());
  if (!src.ok()) return WithContext(src.status(), absl::StrCat(who, ": ", part.source(), ": "));
  std::vector<TensorMeta> tensors;
  for (const TensorMeta& t : src->tensors) tensors.push_back({t.key, t.dtype, t.global_shape});
  ReshardPlanOptions options;
  options.prefer_local = false;
  absl::StatusOr<ReshardPlan> reshard = PlanReshard(src->pieces, dst, options);
  if (!reshard.ok()) {
    return WithContext(reshard.status(),
                       absl::StrCat(who, ": planning the reads from ", part.source(), ": "));
  }
  const int64_t share = std::max<int64_t>(1, part.memory_budget_bytes() / 3);
  PieceAssembler assembler(**reader, src->pieces, dst, *reshard, share);
  std::map<const PlannedPiece*, int64_t> index;
  for (const PlannedFile& f : plan.writers[0].files) {
    for (const PlannedPiece& p : f.pieces) index.emplace(&p, static_cast<int64_t>(index.size()));
  }
  auto fill = [&](absl::Span<const PlannedPiece* const> pieces,
                  absl::Span<char* const> buffers) -> absl::Status {
    if (cancelled && cancelled()) {
      return absl::CancelledError("the operation was aborted; stopped between waves");
    }
    std::vector<int64_t> wanted;
    wanted.reserve(pieces.size());
    for (const PlannedPiece* p : pieces) wanted.push_back(index.at(p));
    return assembler.Fill(wanted, buffers);
  };
  WaveOptions waves;
  waves.wave_bytes = share;
  waves.overlap = true;
  waves.progress = [&](const WaveProgress& p) {
    if (progress) progress(p.bytes_done);
  };
  WaveWriteStats write;
  absl::StatusOr<WrittenData> written =
      WriteFilesInWaves(part.staging_dir(), tensors, plan, fill, waves, WriteOptions(), &write);
  stats->bytes_read = assembler.stats().bytes_read;
  stats->read_seconds = assembler.stats().read_seconds;
  stats->write_seconds = write.write_seconds;
  if (!written.ok()) {
    return WithContext(written.status(),
                       absl::StrCat(who, ": writing into ", part.staging_dir(), ": "));
  }
  stats->pieces = static_cast<int64_t>(written->pieces.size());
  stats->files = static_cast<int64_t>(written->files.size());
  stats->bytes_written = write.bytes_written;
  for (pb::StoredPiece& p : written->pieces) *record.add_pieces() = std::move(p);
  for (pb::DataFile& f : written->files) *record.add_files() = std::move(f);
  return record.SerializeAsString();
}

}  // namespace ckpt::worker
