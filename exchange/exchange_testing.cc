#include "exchange/exchange_testing.h"

#include <algorithm>
#include <random>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

uint8_t ElementByte(uint64_t key_hash, int64_t global_index, int64_t byte) {
  uint64_t x = key_hash ^ (static_cast<uint64_t>(global_index) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(byte) << 56);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

uint64_t KeyHash(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return h;
}

// torch.chunk of length L into m parts: chunk = ceil(L/m); part i is [i*chunk, min(L, ...)).
std::vector<std::pair<int64_t, int64_t>> Chunks(int64_t length, int m) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t chunk = (length + m - 1) / m;
  for (int i = 0; i < m; ++i) {
    int64_t lo = std::min(length, i * chunk), hi = std::min(length, (i + 1) * chunk);
    out.push_back({lo, hi - lo});
  }
  return out;
}

PieceSpec Spec(const std::string& key, DType dtype, const std::vector<int64_t>& shape,
               Region region) {
  PieceSpec s;
  s.id.key = key;
  s.id.offsets = region.offsets;
  s.id.flat = region.flat;
  s.dtype = dtype;
  s.global_shape = shape;
  s.region = std::move(region);
  return s;
}

// Regions of `shape` split along `dim` into m torch.chunk parts.
std::vector<Region> SplitAlong(const std::vector<int64_t>& shape, int dim, int m) {
  std::vector<Region> out;
  for (auto [lo, len] : Chunks(shape[dim], m)) {
    Region r = WholeRegion(shape);
    r.offsets[dim] = lo;
    r.lengths[dim] = len;
    out.push_back(r);
  }
  return out;
}

// Regions covering the whole box of `shape` as flat ranges cut at uneven points.
std::vector<Region> SplitFlat(const std::vector<int64_t>& shape, int m) {
  std::vector<Region> out;
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  int64_t at = 0;
  for (int i = 0; i < m; ++i) {
    int64_t stop = i == m - 1 ? total : std::min(total, at + (total * (i + 1)) / (m + 1) + i % 2);
    Region r = WholeRegion(shape);
    r.flat = FlatRange{at, stop};
    out.push_back(r);
    at = stop;
  }
  return out;
}

}  // namespace

std::string ReferenceRegionBytes(const PieceSpec& spec) {
  const int64_t esize = DTypeSize(spec.dtype);
  const Region& r = spec.region;
  const int64_t count = r.NumElements();
  const int64_t first = r.flat ? r.flat->start : 0;
  const uint64_t kh = KeyHash(spec.id.key);
  std::string out(count * esize, '\0');
  const int nd = r.ndim();
  std::vector<int64_t> coord(nd);
  for (int64_t i = 0; i < count; ++i) {
    int64_t f = first + i;
    for (int d = nd - 1; d >= 0; --d) {
      coord[d] = r.lengths[d] == 0 ? 0 : f % r.lengths[d];
      f = r.lengths[d] == 0 ? 0 : f / r.lengths[d];
    }
    int64_t g = 0;
    for (int d = 0; d < nd; ++d) g = g * spec.global_shape[d] + r.offsets[d] + coord[d];
    for (int64_t b = 0; b < esize; ++b)
      out[i * esize + b] = static_cast<char>(ElementByte(kh, g, b));
  }
  return out;
}

namespace {

// A tensor of a scenario; flat-stored ones are saved as flat ranges.
struct ScenarioTensor {
  std::string key;
  DType dtype;
  std::vector<int64_t> shape;
  bool flat_stored;
};

// One tensor per dtype, of varied ranks and shapes (an empty one and a scalar included).
std::vector<ScenarioTensor> ScenarioTensors(int n, int64_t scale) {
  std::vector<ScenarioTensor> tensors;
  int j = 0;
  for (DType dtype : kAllDTypes) {
    std::vector<int64_t> shape;
    const int64_t s = scale;
    switch (j % 4) {
      case 0:
        shape = {2 * n + j % 3 + 1, (3 + j % 5) * s};
        break;
      case 1:
        shape = {(5 + j) * s};
        break;
      case 2:
        shape = j == 2 ? std::vector<int64_t>{0, 4} : std::vector<int64_t>{3, 2, (j % 3 + 2) * s};
        break;
      default:
        shape = j == 3 ? std::vector<int64_t>{} : std::vector<int64_t>{7, 3 * s};
        break;
    }
    tensors.push_back({absl::StrCat("layer", j, ".", DTypeName(dtype)), dtype, shape,
                       j % 3 == 0 && !shape.empty()});
    ++j;
  }
  return tensors;
}

// The stored pieces (dim-0 or flat chunks) on pseudo-random main ranks, shuffled (Megatron's
// distribution order is not the id order), with coinciding ids dropped.
std::vector<DistributedPiece> DistributeScenario(const std::vector<ScenarioTensor>& tensors, int n,
                                                 std::mt19937_64& rng) {
  std::vector<DistributedPiece> distribution;
  int piece = 0;
  for (const ScenarioTensor& t : tensors) {
    std::vector<Region> regions;
    if (t.shape.empty()) {
      regions = {WholeRegion(t.shape)};
    } else if (t.flat_stored) {
      regions = SplitFlat(t.shape, n + 1);
    } else {
      regions =
          SplitAlong(t.shape, 0, std::min<int64_t>(n + 1, std::max<int64_t>(1, t.shape[0] + 1)));
    }
    for (Region& region : regions) {
      DistributedPiece d;
      d.spec = Spec(t.key, t.dtype, t.shape, region);
      d.main_rank = static_cast<int>((piece * 7 + rng() % 3) % n);
      ++piece;
      distribution.push_back(std::move(d));
    }
  }
  std::shuffle(distribution.begin(), distribution.end(), rng);
  // Some stored ids may coincide (e.g. empty dim-0 chunks at the same offset): keep the first.
  std::vector<DistributedPiece> unique;
  for (DistributedPiece& d : distribution) {
    bool dup = false;
    for (const DistributedPiece& u : unique) dup = dup || u.spec.id == d.spec.id;
    if (!dup) unique.push_back(std::move(d));
  }
  return unique;
}

// Reshard needs: per rank a column (last-dim) chunk of every tensor, flat ranges with other cut
// points for flat-stored ones, the scalar whole, and on rank 0 one whole tensor as a flat range.
void AddReshardNeeds(const std::vector<ScenarioTensor>& tensors, int n, ExchangePlan* plan) {
  for (const ScenarioTensor& t : tensors) {
    if (t.shape.empty()) {
      for (int r = 0; r < n; ++r) {
        plan->needs[r].push_back(Spec(t.key, t.dtype, t.shape, WholeRegion(t.shape)));
      }
      continue;
    }
    // Column (last-dim) chunks, one per rank, empty ones included.
    std::vector<Region> cols = SplitAlong(t.shape, static_cast<int>(t.shape.size()) - 1, n);
    for (int r = 0; r < n; ++r) plan->needs[r].push_back(Spec(t.key, t.dtype, t.shape, cols[r]));
    // Flat-stored tensors: also flat ranges with different cut points.
    if (t.flat_stored) {
      std::vector<Region> flats = SplitFlat(t.shape, n);
      for (int r = 0; r < n; ++r) {
        Region f = flats[(r + 1) % n];
        // A column chunk may share offsets with this flat region's box: ids differ by flat.
        plan->needs[r].push_back(Spec(t.key, t.dtype, t.shape, f));
      }
    }
  }
  // Rank 0 also needs one whole tensor (as a full flat range, so its id differs from the
  // column chunk at the same offsets).
  const ScenarioTensor& whole = tensors[4];
  Region w = WholeRegion(whole.shape);
  w.flat = FlatRange{0, w.BoxElements()};
  plan->needs[0].push_back(Spec(whole.key, whole.dtype, whole.shape, w));
}

}  // namespace

Scenario MakeScenario(const ScenarioOptions& options) {
  const int n = options.num_ranks;
  std::mt19937_64 rng(options.seed * 7919 + n);
  const std::vector<ScenarioTensor> tensors = ScenarioTensors(n, options.scale);
  Scenario sc;
  sc.plan.num_ranks = n;
  sc.plan.needs.resize(n);
  sc.loaded.resize(n);
  sc.plan.distribution = DistributeScenario(tensors, n, rng);
  for (const DistributedPiece& d : sc.plan.distribution) {
    sc.loaded[d.main_rank][d.spec.id] = ReferenceRegionBytes(d.spec);
  }
  if (!options.reshard) {
    // Replica needs: every stored piece on its main rank and, pseudo-randomly, elsewhere.
    for (const DistributedPiece& d : sc.plan.distribution) {
      for (int r = 0; r < n; ++r) {
        if (r == d.main_rank || rng() % 3 == 0) sc.plan.needs[r].push_back(d.spec);
      }
    }
  } else {
    AddReshardNeeds(tensors, n, &sc.plan);
  }
  return sc;
}

ShardBuffers ReferenceOutputs(const ExchangePlan& plan, int rank) {
  ShardBuffers out;
  for (const PieceSpec& need : plan.needs[rank]) out[need.id] = ReferenceRegionBytes(need);
  return out;
}

int64_t LowerBoundReceiveBytes(const ExchangePlan& plan, int rank) {
  // Brute force: mark the needed elements stored on this rank, count the rest.
  int64_t bytes = 0;
  for (const PieceSpec& need : plan.needs[rank]) {
    const Region& r = need.region;
    const int64_t count = r.NumElements();
    const int64_t first = r.flat ? r.flat->start : 0;
    const int nd = r.ndim();
    std::vector<int64_t> coord(nd);
    for (int64_t i = 0; i < count; ++i) {
      int64_t f = first + i;
      for (int d = nd - 1; d >= 0; --d) {
        coord[d] = r.offsets[d] + (r.lengths[d] == 0 ? 0 : f % r.lengths[d]);
        f = r.lengths[d] == 0 ? 0 : f / r.lengths[d];
      }
      bool local = false;
      for (const DistributedPiece& d : plan.distribution) {
        if (d.main_rank != rank || d.spec.id.key != need.id.key) continue;
        const Region& s = d.spec.region;
        bool inside = true;
        int64_t sf = 0;
        for (int k = 0; k < nd && inside; ++k) {
          int64_t c = coord[k] - s.offsets[k];
          inside = c >= 0 && c < s.lengths[k];
          sf = sf * s.lengths[k] + c;
        }
        if (inside && s.flat) inside = sf >= s.flat->start && sf < s.flat->stop;
        if (inside) {
          local = true;
          break;
        }
      }
      if (!local) bytes += DTypeSize(need.dtype);
    }
  }
  return bytes;
}

bool FaultInjectingCommunicator::Fault(absl::Status* status) {
  ++calls_;
  if (calls_ == fail_at_) {
    *status = on_fault_(inner_);
    return true;
  }
  if (inner_ == nullptr) {
    *status = absl::FailedPreconditionError("fault-injecting communicator: inner one dropped");
    return true;
  }
  return false;
}

#define CKPT_FORWARD(call)           \
  absl::Status status;               \
  if (Fault(&status)) return status; \
  return inner_->call

absl::Status FaultInjectingCommunicator::Broadcast(void* data, size_t bytes, int root,
                                                   absl::Time deadline) {
  CKPT_FORWARD(Broadcast(data, bytes, root, deadline));
}
absl::Status FaultInjectingCommunicator::AllGatherV(const void* send,
                                                    absl::Span<const size_t> counts, void* recv,
                                                    absl::Time deadline) {
  CKPT_FORWARD(AllGatherV(send, counts, recv, deadline));
}
absl::Status FaultInjectingCommunicator::GatherV(const void* send, size_t send_bytes,
                                                 absl::Span<const size_t> counts, void* recv,
                                                 int root, absl::Time deadline) {
  CKPT_FORWARD(GatherV(send, send_bytes, counts, recv, root, deadline));
}
absl::Status FaultInjectingCommunicator::ScatterV(const void* send, absl::Span<const size_t> counts,
                                                  void* recv, size_t recv_bytes, int root,
                                                  absl::Time deadline) {
  CKPT_FORWARD(ScatterV(send, counts, recv, recv_bytes, root, deadline));
}
absl::Status FaultInjectingCommunicator::AllToAllV(const void* send,
                                                   absl::Span<const size_t> send_counts, void* recv,
                                                   absl::Span<const size_t> recv_counts,
                                                   absl::Time deadline) {
  CKPT_FORWARD(AllToAllV(send, send_counts, recv, recv_counts, deadline));
}
absl::Status FaultInjectingCommunicator::IndexedAllToAllV(
    const void* send, absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
    absl::Span<const std::vector<ByteSlice>> recv_slices, absl::Time deadline) {
  CKPT_FORWARD(IndexedAllToAllV(send, send_slices, recv, recv_slices, deadline));
}
absl::Status FaultInjectingCommunicator::AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                                          absl::Span<const RecvBuffer> recvs,
                                                          absl::Time deadline) {
  CKPT_FORWARD(AllToAllVBuffers(sends, recvs, deadline));
}
absl::Status FaultInjectingCommunicator::Send(const void* data, size_t bytes, int peer,
                                              uint32_t tag, absl::Time deadline) {
  CKPT_FORWARD(Send(data, bytes, peer, tag, deadline));
}
absl::Status FaultInjectingCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                              absl::Time deadline) {
  CKPT_FORWARD(Recv(data, bytes, peer, tag, deadline));
}
absl::Status FaultInjectingCommunicator::Barrier(absl::Time deadline) {
  CKPT_FORWARD(Barrier(deadline));
}

}  // namespace ckpt
