#include "examples/gpt_checkpoint.h"

#include <memory>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "examples/gpt_state.h"
#include "planner/save_plan.h"
#include "storage/checkpoint_reader.h"

namespace ckpt {
namespace {

std::map<std::string, const TensorMeta*> ByKey(const std::vector<TensorMeta>& tensors) {
  std::map<std::string, const TensorMeta*> out;
  for (const TensorMeta& t : tensors) out[t.key] = &t;
  return out;
}

}  // namespace

absl::StatusOr<WaveWriteStats> WriteGptCheckpoint(
    const std::string& path, const std::vector<TensorMeta>& tensors, const LayoutSpec& layout,
    int64_t wave_bytes, const WriteOptions& options, int64_t step,
    const std::map<std::string, std::string>& user_metadata) {
  CKPT_ASSIGN_OR_RETURN(std::vector<TensorPiece> pieces,
                        layout.AllPieces(tensors, /*drop_empty=*/true));
  SavePlanOptions sp;
  sp.target_file_bytes = std::max<int64_t>(1, std::min<int64_t>(int64_t{256} << 20, wave_bytes));
  CKPT_ASSIGN_OR_RETURN(SavePlan plan, BuildSavePlan(pieces, layout.world_size(), sp));
  std::vector<TensorMeta> specs;
  for (const TensorMeta& t : tensors) specs.push_back({t.key, t.dtype, t.global_shape});
  CheckpointContents info;
  CKPT_ASSIGN_OR_RETURN(info.saved_layout, layout.ToSavedLayout(tensors));
  info.step = step;
  info.user_metadata = user_metadata;
  const auto by_key = ByKey(tensors);
  WaveOptions wave;
  wave.wave_bytes = wave_bytes;
  return WriteCheckpointInWaves(
      path, specs, plan, info,
      [&](absl::Span<const PlannedPiece* const> wave, absl::Span<char* const> buffers) {
        for (size_t i = 0; i < wave.size(); ++i) {
          CKPT_RETURN_IF_ERROR(FillPiece(*by_key.at(wave[i]->key), wave[i]->region,
                                         absl::MakeSpan(buffers[i], wave[i]->size_bytes)));
        }
        return absl::OkStatus();
      },
      wave, options);
}

absl::StatusOr<GptCheckReport> CheckGptCheckpoint(const std::string& path,
                                                  const std::vector<TensorMeta>& tensors,
                                                  const LayoutSpec& layout) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  CKPT_ASSIGN_OR_RETURN(std::vector<TensorPiece> pieces,
                        layout.AllPieces(tensors, /*drop_empty=*/true));
  const auto by_key = ByKey(tensors);
  std::set<std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t>>
      seen;
  GptCheckReport report;
  std::vector<char> buffer;
  for (const TensorPiece& p : pieces) {
    const auto id = std::make_tuple(p.key, p.region.offsets, p.region.lengths,
                                    p.region.flat ? p.region.flat->start : -1,
                                    p.region.flat ? p.region.flat->stop : -1);
    if (!seen.insert(id).second) continue;
    const TensorMeta& t = *by_key.at(p.key);
    buffer.resize(p.region.NumElements() * DTypeSize(t.dtype));
    absl::Status read = reader->ReadRegion(p.key, p.region, buffer.data());
    if (!read.ok()) {
      return absl::Status(read.code(), absl::StrCat("rank ", p.rank, ": ", read.message()));
    }
    absl::Status ok = VerifyPiece(t, p.region, buffer);
    if (!ok.ok()) {
      return absl::Status(ok.code(), absl::StrCat(path, " rank ", p.rank, ": ", ok.message()));
    }
    ++report.regions;
    report.elements += p.region.NumElements();
    report.bytes += static_cast<int64_t>(buffer.size());
  }
  return report;
}

}  // namespace ckpt
