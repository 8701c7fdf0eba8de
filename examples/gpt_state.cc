#include "examples/gpt_state.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

// One contiguous run of a piece's storage: `n` elements from local index `local`, which are
// global (row-major) indices `global` .. global + n - 1.
struct GlobalRun {
  int64_t local = 0;
  int64_t global = 0;
  int64_t n = 0;
};

// Calls fn(run) for the runs of `region` (validated against `shape`) in storage order.
template <typename Fn>
void ForEachGlobalRun(const Region& region, absl::Span<const int64_t> shape, Fn fn) {
  const int nd = region.ndim();
  const int64_t box = region.BoxElements();
  const int64_t begin = region.flat ? region.flat->start : 0;
  const int64_t end = region.flat ? region.flat->stop : box;
  if (begin >= end) return;
  if (nd == 0) {
    fn(GlobalRun{0, 0, 1});
    return;
  }
  std::vector<int64_t> stride(nd, 1);  // global strides
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  const int64_t row_len = region.lengths[nd - 1];
  int64_t row = begin / row_len;
  int64_t col = begin % row_len;
  std::vector<int64_t> coord(nd, 0);  // box coordinates of the current row (dims < nd - 1)
  for (int d = nd - 2; d >= 0; --d) {
    coord[d] = row % region.lengths[d];
    row /= region.lengths[d];
  }
  int64_t local = 0;
  int64_t b = begin;
  while (b < end) {
    int64_t g = region.offsets[nd - 1] + col;
    for (int d = 0; d < nd - 1; ++d) g += (region.offsets[d] + coord[d]) * stride[d];
    const int64_t n = std::min(row_len - col, end - b);
    fn(GlobalRun{local, g, n});
    local += n;
    b += n;
    col = 0;
    for (int d = nd - 2; d >= 0; --d) {
      if (++coord[d] < region.lengths[d]) break;
      coord[d] = 0;
    }
  }
}

template <int kSize>
void FillRun(uint64_t key_hash, const GlobalRun& run, char* out) {
  char* p = out + run.local * kSize;
  for (int64_t i = 0; i < run.n; ++i, p += kSize) {
    const uint64_t v = ElementPattern(key_hash, run.global + i);
    std::memcpy(p, &v, kSize);
  }
}

// Index of the first mismatching element of the run, or -1.
template <int kSize>
int64_t CheckRun(uint64_t key_hash, const GlobalRun& run, const char* data) {
  const char* p = data + run.local * kSize;
  for (int64_t i = 0; i < run.n; ++i, p += kSize) {
    const uint64_t v = ElementPattern(key_hash, run.global + i);
    if (std::memcmp(p, &v, kSize) != 0) return i;
  }
  return -1;
}

std::string HexBytes(const void* data, int64_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  // Little-endian value: most significant byte first.
  for (int64_t i = n - 1; i >= 0; --i) {
    const unsigned char c = static_cast<const unsigned char*>(data)[i];
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

absl::Status CheckSize(const TensorMeta& tensor, const Region& region, int64_t size) {
  absl::Status valid = ValidateRegion(region, tensor.global_shape);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.key, "\" region ",
                                                   region.DebugString(), ": ", valid.message()));
  }
  const int64_t want = region.NumElements() * DTypeSize(tensor.dtype);
  if (size != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.key, "\" region ",
                                                   region.DebugString(), ": buffer of ", size,
                                                   " bytes, expected ", want));
  }
  return absl::OkStatus();
}

void AddTensor(std::vector<TensorMeta>* out, std::string key, std::vector<int64_t> shape,
               DType dtype) {
  out->push_back(TensorMeta{std::move(key), dtype, std::move(shape)});
}

}  // namespace

uint64_t KeyHash(const std::string& key) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t ElementPattern(uint64_t key_hash, int64_t global_index) {
  // splitmix64 of the key hash advanced by the index.
  uint64_t z = key_hash + static_cast<uint64_t>(global_index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

GptConfig GptConfigForBytes(int64_t total_bytes) {
  // 8 layers, vocab 16 * hidden: params ~ 96 h^2 + 32 h^2 = 128 h^2, 14 bytes each.
  GptConfig c;
  c.layers = 8;
  const double params = static_cast<double>(total_bytes) / 14.0;
  int64_t h = static_cast<int64_t>(std::llround(std::sqrt(params / 128.0) / 128.0)) * 128;
  c.hidden = std::max<int64_t>(128, h);
  c.vocab = 16 * c.hidden;
  return c;
}

absl::StatusOr<std::vector<TensorMeta>> GptTensors(const GptConfig& config) {
  if (config.layers < 0 || config.hidden < 1 || config.vocab < 1 || config.ffn < 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid GPT config: layers ", config.layers,
                                                   ", hidden ", config.hidden, ", vocab ",
                                                   config.vocab, ", ffn ", config.ffn));
  }
  const int64_t h = config.hidden, f = config.ffn_size(), v = config.vocab;
  const DType w = config.param_dtype;
  std::vector<TensorMeta> weights;
  AddTensor(&weights, "embedding.word_embeddings.weight", {v, h}, w);
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string l = absl::StrCat("layers.", i, ".");
    AddTensor(&weights, l + "input_layernorm.weight", {h}, w);
    AddTensor(&weights, l + "input_layernorm.bias", {h}, w);
    AddTensor(&weights, l + "attention.qkv.weight", {3 * h, h}, w);
    AddTensor(&weights, l + "attention.qkv.bias", {3 * h}, w);
    AddTensor(&weights, l + "attention.proj.weight", {h, h}, w);
    AddTensor(&weights, l + "attention.proj.bias", {h}, w);
    AddTensor(&weights, l + "post_attention_layernorm.weight", {h}, w);
    AddTensor(&weights, l + "post_attention_layernorm.bias", {h}, w);
    AddTensor(&weights, l + "mlp.fc1.weight", {f, h}, w);
    AddTensor(&weights, l + "mlp.fc1.bias", {f}, w);
    AddTensor(&weights, l + "mlp.fc2.weight", {h, f}, w);
    AddTensor(&weights, l + "mlp.fc2.bias", {h}, w);
  }
  AddTensor(&weights, "final_layernorm.weight", {h}, w);
  AddTensor(&weights, "final_layernorm.bias", {h}, w);
  AddTensor(&weights, "output_layer.weight", {v, h}, w);
  std::vector<TensorMeta> all = weights;
  if (config.with_optimizer) {
    for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
      for (const TensorMeta& t : weights) {
        AddTensor(&all, absl::StrCat("optimizer.", state, ".", t.key), t.global_shape, DType::kF32);
      }
    }
  }
  for (const TensorMeta& t : all) {
    absl::StatusOr<int64_t> n = CheckedNumElements(t.global_shape);
    if (!n.ok()) return n.status();
  }
  return all;
}

int64_t TotalBytes(absl::Span<const TensorMeta> tensors) {
  int64_t total = 0;
  for (const TensorMeta& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.global_shape) n *= d;
    total += n * DTypeSize(t.dtype);
  }
  return total;
}

std::string GptLayoutJson(int64_t tp, int64_t dp, bool flat_optimizer) {
  // Megatron numbers ranks with tp fastest: rank = dp_index * tp + tp_index.
  const char* column[] = {"embedding.word_embeddings.weight",
                          "*.attention.qkv.weight",
                          "*.attention.qkv.bias",
                          "*.mlp.fc1.weight",
                          "*.mlp.fc1.bias",
                          "output_layer.weight"};
  const char* row[] = {"*.attention.proj.weight", "*.mlp.fc2.weight"};
  std::vector<std::string> rules;
  auto add = [&](const std::string& match, const char* tp_placement, bool flat) {
    rules.push_back(absl::StrCat("    {\"match\": \"", match,
                                 "\", \"placements\": [\"Replicate()\", \"", tp_placement, "\"]",
                                 flat ? ", \"flat\": {\"over\": \"dp\"}" : "", "}"));
  };
  const std::string opt = "optimizer.*.";
  for (const char* m : column) add(opt + (m[0] == '*' ? m + 2 : m), "Shard(0)", flat_optimizer);
  for (const char* m : row) add(opt + (m[0] == '*' ? m + 2 : m), "Shard(1)", flat_optimizer);
  add("optimizer.*", "Replicate()", flat_optimizer);
  for (const char* m : column) add(m, "Shard(0)", false);
  for (const char* m : row) add(m, "Shard(1)", false);
  add("*", "Replicate()", false);
  return absl::StrCat("{\n  \"world_size\": ", tp * dp, ",\n  \"mesh\": {\"dp\": ", dp,
                      ", \"tp\": ", tp, "},\n  \"rules\": [\n", absl::StrJoin(rules, ",\n"),
                      "\n  ]\n}\n");
}

absl::Status FillPiece(const TensorMeta& tensor, const Region& region, absl::Span<char> out) {
  absl::Status ok = CheckSize(tensor, region, static_cast<int64_t>(out.size()));
  if (!ok.ok()) return ok;
  const uint64_t kh = KeyHash(tensor.key);
  const int64_t es = DTypeSize(tensor.dtype);
  ForEachGlobalRun(region, tensor.global_shape, [&](const GlobalRun& run) {
    switch (es) {
      case 1:
        FillRun<1>(kh, run, out.data());
        break;
      case 2:
        FillRun<2>(kh, run, out.data());
        break;
      case 4:
        FillRun<4>(kh, run, out.data());
        break;
      default:
        FillRun<8>(kh, run, out.data());
        break;
    }
  });
  return absl::OkStatus();
}

absl::Status VerifyPiece(const TensorMeta& tensor, const Region& region,
                         absl::Span<const char> data) {
  absl::Status ok = CheckSize(tensor, region, static_cast<int64_t>(data.size()));
  if (!ok.ok()) return ok;
  const uint64_t kh = KeyHash(tensor.key);
  const int64_t es = DTypeSize(tensor.dtype);
  bool found = false;
  GlobalRun bad;
  int64_t bad_i = 0;
  ForEachGlobalRun(region, tensor.global_shape, [&](const GlobalRun& run) {
    if (found) return;
    int64_t i = -1;
    switch (es) {
      case 1:
        i = CheckRun<1>(kh, run, data.data());
        break;
      case 2:
        i = CheckRun<2>(kh, run, data.data());
        break;
      case 4:
        i = CheckRun<4>(kh, run, data.data());
        break;
      default:
        i = CheckRun<8>(kh, run, data.data());
        break;
    }
    if (i >= 0) {
      found = true;
      bad = run;
      bad_i = i;
    }
  });
  if (!found) return absl::OkStatus();
  const int64_t global = bad.global + bad_i;
  const int64_t local = bad.local + bad_i;
  std::vector<int64_t> coord(tensor.global_shape.size());
  int64_t rest = global;
  for (int d = static_cast<int>(coord.size()) - 1; d >= 0; --d) {
    coord[d] = rest % tensor.global_shape[d];
    rest /= tensor.global_shape[d];
  }
  const uint64_t expected = ElementPattern(kh, global);
  return absl::DataLossError(absl::StrCat(
      "tensor \"", tensor.key, "\" region ", region.DebugString(), ": element at global index ",
      global, " (", absl::StrJoin(coord, ", "), "), local index ", local, ": expected ",
      HexBytes(&expected, es), ", got ", HexBytes(data.data() + local * es, es)));
}

}  // namespace ckpt
