// An example GPT-style training state for demos and tests: bf16 model weights laid out
// Megatron-style over a TP x DP mesh (column-parallel qkv/fc1 and the vocab-parallel embedding
// and output layer split along dim 0, row-parallel proj/fc2 along dim 1, norms replicated) and
// fp32 Adam state (master weights, exp_avg, exp_avg_sq) with the same TP split, flat-sharded
// ZeRO-1 style over DP.
//
// Element content is a deterministic function of (tensor key, global element index): any rank
// can fill any piece and any reader can verify any region without a reference copy.
#ifndef CKPT_EXAMPLES_GPT_STATE_H_
#define CKPT_EXAMPLES_GPT_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/region.h"
#include "sharding/tensor_meta.h"

namespace ckpt {

// Model size. Parameters are about layers * 12 * hidden^2 + 2 * vocab * hidden; with the
// optimizer state each parameter costs 2 + 3 * 4 = 14 bytes.
struct GptConfig {
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t vocab = 256;
  int64_t ffn = 0;  // 0: 4 * hidden
  DType param_dtype = DType::kBF16;
  bool with_optimizer = true;

  int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
};

// A config of about `total_bytes` in total (weights + optimizer), hidden a multiple of 128.
GptConfig GptConfigForBytes(int64_t total_bytes);

// Every tensor of the state (weights first, then "optimizer.<state>.<weight key>").
absl::StatusOr<std::vector<TensorMeta>> GptTensors(const GptConfig& config);

// Total bytes of all tensors.
int64_t TotalBytes(absl::Span<const TensorMeta> tensors);

// The Megatron-style layout JSON (planner/layout_spec.h, docs/layout.md) for a
// {"tp": tp, "dp": dp} mesh; optimizer state flat over dp when `flat_optimizer`, else
// replicated over dp like the weights.
std::string GptLayoutJson(int64_t tp, int64_t dp, bool flat_optimizer = true);

// The bytes of element `global_index` of tensor `key`: the low DTypeSize bytes of a 64-bit
// hash of (key, index), little-endian.
uint64_t ElementPattern(uint64_t key_hash, int64_t global_index);
uint64_t KeyHash(const std::string& key);

// Fills `out` (exactly region.NumElements() * DTypeSize bytes, storage convention of
// sharding/overlap.h) with the tensor's content over `region`.
absl::Status FillPiece(const TensorMeta& tensor, const Region& region, absl::Span<char> out);

// Checks `data` holds the tensor's content over `region`. The first mismatch is DataLoss
// naming the key, region, global element index and coordinates, expected and actual bytes.
absl::Status VerifyPiece(const TensorMeta& tensor, const Region& region,
                         absl::Span<const char> data);

}  // namespace ckpt

#endif  // CKPT_EXAMPLES_GPT_STATE_H_
