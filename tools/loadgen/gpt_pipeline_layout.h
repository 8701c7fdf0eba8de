// The per-rank state a Megatron-style GPT job describes at TP x PP x DP: pipeline stage s holds
// layers [s * L / PP, (s + 1) * L / PP) (global layer numbers, as Megatron's distributed
// checkpoints key them), stage 0 also the word embedding, the last stage the final norm and
// the output layer; within a stage every tensor is laid out by examples/' GptLayoutJson over a
// {"dp": DP, "tp": TP} mesh (TP splits as Megatron does, replicas over DP, the fp32 optimizer
// state flat-sharded over DP, ZeRO-1 style). Ranks are numbered as Megatron's default order
// "tp-cp-ep-dp-pp": rank = tp + TP * (dp + DP * pp).
//
// Used by ckpt_loadgen to describe realistic ranks without holding any tensor bytes. Pure: no
// I/O, threads or logging.
#ifndef CKPT_TOOLS_LOADGEN_GPT_PIPELINE_LAYOUT_H_
#define CKPT_TOOLS_LOADGEN_GPT_PIPELINE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "examples/gpt_state.h"
#include "planner/layout_spec.h"
#include "proto/coordinator.pb.h"

namespace ckpt::loadgen {

// Parallel sizes of a job.
struct Parallelism {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;

  int64_t world_size() const { return tp * pp * dp; }
};

// Parses "tp8pp16" (tp and pp, in that order, each optional: "tp8", "pp4", "tp2pp2") and
// derives dp from `ranks`, which must be a multiple of tp * pp. InvalidArgument naming the
// layout and the rank count otherwise.
absl::StatusOr<Parallelism> ParseParallelism(absl::string_view layout, int64_t ranks);

// Named model sizes: "gpt-175b" (96 layers, hidden 12288, vocab 51200: GPT-3 175B) and
// "small" (16 layers, hidden 256, vocab 1024: a few tens of MB, for tests). InvalidArgument
// listing the names otherwise.
absl::StatusOr<GptConfig> ModelByName(absl::string_view name);

// Every rank's state description of one GPT job. Immutable once created.
class GptPipelineLayout {
 public:
  // InvalidArgument when layers are not a multiple of pp or a stage layout is invalid.
  static absl::StatusOr<GptPipelineLayout> Create(const GptConfig& model, Parallelism parallel);

  const Parallelism& parallelism() const { return parallel_; }
  int64_t world_size() const { return parallel_.world_size(); }
  // Every tensor of the model (all stages).
  const std::vector<TensorMeta>& tensors() const { return tensors_; }
  // The pipeline stage of `rank`.
  int64_t StageOf(int64_t rank) const { return rank / (parallel_.tp * parallel_.dp); }

  // The shards `rank` holds (its stage's tensors in model order; empty flat pieces included,
  // as the reference trainer declares them), as a RankState for JoinOperation. With
  // `compact`, each tensor is described by its stage rule's placements over the rank's mesh
  // coordinate (RankState.compact_tensors, issue 16) instead of its piece.
  absl::StatusOr<pb::RankState> RankState(int64_t rank, bool compact = false) const;

 private:
  GptPipelineLayout() = default;

  Parallelism parallel_;
  std::vector<TensorMeta> tensors_;
  std::vector<std::vector<TensorMeta>> stage_tensors_;  // by stage
  std::vector<LayoutSpec> stage_layouts_;               // by stage: {"dp": DP, "tp": TP}
};

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_GPT_PIPELINE_LAYOUT_H_
