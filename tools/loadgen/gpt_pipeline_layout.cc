#include "tools/loadgen/gpt_pipeline_layout.h"

#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/compact_convert.h"
#include "proto/convert.h"

namespace ckpt::loadgen {
namespace {

// The layer number of a "layers.<n>." key (also under "optimizer.<state>."), or -1.
int64_t LayerOf(absl::string_view key) {
  size_t at = key.find("layers.");
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = key.substr(at + 7);
  int64_t layer = -1;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer)) return -1;
  return layer;
}

// Reads the number after `prefix` at the front of `*text`; false when there is none.
bool ConsumeSize(absl::string_view* text, absl::string_view prefix, int64_t* value) {
  if (!absl::ConsumePrefix(text, prefix)) return false;
  size_t digits = 0;
  while (digits < text->size() && (*text)[digits] >= '0' && (*text)[digits] <= '9') ++digits;
  if (digits == 0 || !absl::SimpleAtoi(text->substr(0, digits), value) || *value < 1) return false;
  text->remove_prefix(digits);
  return true;
}

}  // namespace

absl::StatusOr<Parallelism> ParseParallelism(absl::string_view layout, int64_t ranks) {
  Parallelism p;
  absl::string_view rest = layout;
  const bool has_tp = rest.substr(0, 2) == "tp";
  if (has_tp && !ConsumeSize(&rest, "tp", &p.tp)) rest = layout;
  const bool has_pp = rest.substr(0, 2) == "pp";
  if (has_pp && !ConsumeSize(&rest, "pp", &p.pp)) rest = layout;
  if (!rest.empty() || layout.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout \"", layout, "\": expected tp<N>pp<M> (e.g. tp8pp16; either part optional)"));
  }
  if (ranks < 1 || ranks % (p.tp * p.pp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout ", layout, ": ", ranks, " ranks are not a multiple of tp x pp = ", p.tp * p.pp));
  }
  p.dp = ranks / (p.tp * p.pp);
  return p;
}

absl::StatusOr<GptConfig> ModelByName(absl::string_view name) {
  GptConfig c;
  if (name == "gpt-175b") {
    c.layers = 96;
    c.hidden = 12288;
    c.vocab = 51200;
  } else if (name == "small") {
    c.layers = 16;
    c.hidden = 256;
    c.vocab = 1024;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model \"", name, "\" (known: gpt-175b, small)"));
  }
  return c;
}

absl::StatusOr<GptPipelineLayout> GptPipelineLayout::Create(const GptConfig& model,
                                                            Parallelism parallel) {
  if (parallel.tp < 1 || parallel.pp < 1 || parallel.dp < 1 || model.layers % parallel.pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a model of ", model.layers, " layers cannot run at tp ", parallel.tp, " pp ",
                     parallel.pp, " dp ", parallel.dp, " (layers must be a multiple of pp)"));
  }
  GptPipelineLayout out;
  out.parallel_ = parallel;
  absl::StatusOr<std::vector<TensorMeta>> tensors = GptTensors(model);
  if (!tensors.ok()) return tensors.status();
  out.tensors_ = *std::move(tensors);
  const int64_t layers_per_stage = model.layers / parallel.pp;
  out.stage_tensors_.resize(parallel.pp);
  for (const TensorMeta& t : out.tensors_) {
    const int64_t layer = LayerOf(t.key);
    int64_t stage = 0;
    if (layer >= 0) {
      stage = layer / layers_per_stage;
    } else if (t.key.find("embedding.") == std::string::npos) {
      stage = parallel.pp - 1;  // final norm and output layer
    }
    out.stage_tensors_[stage].push_back(t);
  }
  absl::StatusOr<LayoutSpec> stage = LayoutSpec::Parse(GptLayoutJson(parallel.tp, parallel.dp));
  if (!stage.ok()) return stage.status();
  out.stage_layouts_.assign(parallel.pp, *stage);
  return out;
}

absl::StatusOr<pb::RankState> GptPipelineLayout::RankState(int64_t rank, bool compact) const {
  if (rank < 0 || rank >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside a world of ", world_size()));
  }
  const int64_t stage = StageOf(rank);
  const int64_t in_stage = rank % (parallel_.tp * parallel_.dp);
  const LayoutSpec& spec = stage_layouts_[stage];
  absl::StatusOr<std::vector<TensorPiece>> pieces =
      spec.RankPieces(stage_tensors_[stage], in_stage);
  if (!pieces.ok()) return pieces.status();
  absl::StatusOr<std::vector<int64_t>> coordinate = spec.mesh().Coordinate(in_stage);
  if (!coordinate.ok()) return coordinate.status();
  pb::RankState state;
  state.set_rank(static_cast<int32_t>(rank));
  RankStateWriter writer(&state, /*with_kinds_and_layouts=*/false);
  for (TensorPiece& piece : *pieces) {
    pb::PieceMeta shard;
    *shard.mutable_tensor() =
        TensorMetaToProto(TensorMeta{std::move(piece.key), piece.dtype, piece.global_shape});
    *shard.mutable_region() = RegionToProto(piece.region);
    for (int64_t r : piece.replica_id) shard.add_replica_id(r);
    if (!compact) {
      writer.AddPiece(shard, pb::MEMORY_HOST, pb::TensorLayout());
      continue;
    }
    // Compact: the stage rule's placements over the {"dp", "tp"} mesh at this rank's
    // coordinate, flat over dp for the ZeRO-1 optimizer state (listed if not exact).
    absl::StatusOr<const LayoutRule*> rule = spec.RuleFor(shard.tensor().key());
    if (!rule.ok()) return rule.status();
    pb::TensorLayout layout;
    for (const Placement& p : (*rule)->placements) {
      if (p.is_shard()) {
        layout.add_placements()->set_shard_dim(p.dim);
      } else {
        layout.add_placements()->set_replicate(true);
      }
    }
    std::optional<int64_t> flat_over;
    if ((*rule)->flat_dim) flat_over = *(*rule)->flat_dim;
    writer.AddDTensor(shard, pb::MEMORY_HOST, layout, spec.mesh().shape(), *coordinate, flat_over);
  }
  return state;
}

}  // namespace ckpt::loadgen
