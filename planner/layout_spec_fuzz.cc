// Fuzz target for target layouts (planner/layout_spec.h), the JSON the coordinator takes
// from any caller: LayoutSpec::Parse must answer every input with a layout or an error, and a
// layout it accepts must expand into pieces that store every element of every tensor exactly
// once (ValidateLayout), with each rank's own pieces (RankPieces) equal to its share of the
// whole expansion and a saved-layout record for every tensor. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/layout_spec.h"
#include "sharding/layout.h"

namespace ckpt {
namespace {

// Keys and shapes that the corpus's patterns match in different ways: nested names, a 0-d and
// an empty tensor, a non-ASCII key and a long one.
const std::vector<TensorMeta>& Tensors() {
  static const auto* tensors = new std::vector<TensorMeta>{
      {"layers.0.attention.qkv.weight", DType::kBF16, {6, 4}},
      {"layers.1.mlp.fc2.weight", DType::kBF16, {3, 5}},
      {"optimizer.exp_avg.layers.0.attention.qkv.weight", DType::kF32, {6, 4}},
      {"embedding.word_embeddings.weight", DType::kF32, {7, 3, 2}},
      {"final_norm.bias", DType::kF32, {5}},
      {"step", DType::kI64, {}},
      {"empty", DType::kF32, {0, 3}},
      {"\xc3\xa9t\xc3\xa9", DType::kF32, {3}},
      {std::string(300, 'k') + ".weight", DType::kF32, {2, 2}},
  };
  return *tensors;
}

// Beyond this many pieces only a few ranks are expanded (the full expansion of a 2^20-rank
// layout is legal but would make each input take seconds).
constexpr int64_t kMaxPiecesChecked = 1 << 14;

[[noreturn]] void Fail(const std::string& what, absl::string_view input) {
  std::fprintf(stderr, "layout_spec_fuzz: %s\ninput: %.*s\n", what.c_str(),
               static_cast<int>(std::min<size_t>(input.size(), 2000)), input.data());
  std::abort();
}

void CheckAccepted(const LayoutSpec& spec, absl::string_view input) {
  const std::vector<TensorMeta>& tensors = Tensors();
  std::vector<TensorMeta> covered;  // tensors some rule matches
  for (const TensorMeta& t : tensors) {
    if (spec.RuleFor(t.key).ok()) covered.push_back(t);
  }
  const int64_t world = spec.world_size();
  if (world < 1 || world > kMaxWorldSize) Fail("world size out of range", input);
  const bool full = world * static_cast<int64_t>(covered.size()) <= kMaxPiecesChecked;
  absl::StatusOr<std::vector<TensorPiece>> all;
  if (full) {
    all = spec.AllPieces(covered);
    // Placements may not fit a tensor (Shard(2) of a 1-d one): an error, never a crash.
    if (all.ok()) {
      absl::Status valid = ValidateLayout(*all);
      if (!valid.ok())
        Fail("accepted layout does not store every element once: " + std::string(valid.message()),
             input);
      if (static_cast<int64_t>(all->size()) != world * static_cast<int64_t>(covered.size())) {
        Fail("AllPieces gave the wrong number of pieces", input);
      }
    }
  }
  for (int64_t rank : {int64_t{0}, world / 2, world - 1}) {
    absl::StatusOr<std::vector<TensorPiece>> mine = spec.RankPieces(covered, rank);
    if (full && all.ok() != mine.ok()) Fail("RankPieces and AllPieces disagree on errors", input);
    if (!mine.ok() || !full || !all.ok()) continue;
    for (size_t t = 0; t < covered.size(); ++t) {
      const TensorPiece& expected = (*all)[t * world + rank];
      const TensorPiece& got = (*mine)[t];
      if (got.region != expected.region || got.replica_id != expected.replica_id ||
          got.rank != rank) {
        Fail("RankPieces differs from AllPieces for rank " + std::to_string(rank), input);
      }
    }
  }
  absl::StatusOr<pb::SavedLayout> saved = spec.ToSavedLayout(covered);
  if (!saved.ok() || saved->tensors_size() != static_cast<int>(covered.size())) {
    Fail("no saved layout for matched tensors", input);
  }
}

}  // namespace
}  // namespace ckpt

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ckpt::LayoutSpec> spec = ckpt::LayoutSpec::Parse(input);
  if (!spec.ok()) {
    // Errors are one short line, whatever the input.
    if (spec.status().message().size() > 4096) ckpt::Fail("error message too long", input);
    return 0;
  }
  ckpt::CheckAccepted(*spec, input);
  return 0;
}
