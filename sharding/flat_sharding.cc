#include "sharding/flat_sharding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckpt {
namespace {

absl::Status CheckRank(const FlatShardingSpec& spec, int rank) {
  if (rank < 0 || rank >= spec.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the flat sharding of ", spec.world_size(),
                     " ranks of shape ", ShapeString(spec.unsharded_shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const FlatShardingSpec& spec, int64_t elem_size, size_t bytes) {
  if (elem_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", elem_size, " is not >= 1"));
  }
  CKPT_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(spec.unsharded_shape));
  if (static_cast<int64_t>(bytes) != numel * elem_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsharded buffer has ", bytes, " bytes but shape ", ShapeString(spec.unsharded_shape),
        " of ", elem_size, "-byte elements needs ", numel * elem_size));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> FlatShardingSpec::sharded_numels() const {
  std::vector<int64_t> numels;
  for (const auto& ranges : unsharded_flattened_offsets) {
    int64_t n = 0;
    for (const FlatRange& r : ranges) n += r.size();
    numels.push_back(n);
  }
  return numels;
}

absl::Status ValidateFlatSharding(const FlatShardingSpec& spec, bool require_complete) {
  CKPT_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(spec.unsharded_shape));
  struct Owned {
    FlatRange range;
    int rank;
  };
  std::vector<Owned> all;
  for (int rank = 0; rank < spec.world_size(); ++rank) {
    for (const FlatRange& r : spec.unsharded_flattened_offsets[rank]) {
      if (r.start < 0 || r.start > r.stop || r.stop > numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, " owns flat range [", r.start, ", ", r.stop,
                         ") outside the flattened tensor of shape ",
                         ShapeString(spec.unsharded_shape), " (", numel, " elements)"));
      }
      if (r.size() > 0) all.push_back({r, rank});
    }
  }
  if (!require_complete) return absl::OkStatus();
  std::sort(all.begin(), all.end(),
            [](const Owned& a, const Owned& b) { return a.range.start < b.range.start; });
  int64_t covered = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].range.start < covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("flat ranges overlap: rank ", all[i - 1].rank, " owns [",
                       all[i - 1].range.start, ", ", all[i - 1].range.stop, ") and rank ",
                       all[i].rank, " owns [", all[i].range.start, ", ", all[i].range.stop, ")"));
    }
    if (all[i].range.start > covered) {
      return absl::InvalidArgumentError(absl::StrCat("no rank owns flat elements [", covered, ", ",
                                                     all[i].range.start, ") of shape ",
                                                     ShapeString(spec.unsharded_shape)));
    }
    covered = all[i].range.stop;
  }
  if (covered != numel) {
    return absl::InvalidArgumentError(absl::StrCat("no rank owns flat elements [", covered, ", ",
                                                   numel, ") of shape ",
                                                   ShapeString(spec.unsharded_shape)));
  }
  return absl::OkStatus();
}

absl::StatusOr<FlatShardingSpec> EvenFlatSharding(absl::Span<const int64_t> shape, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " is not >= 1"));
  }
  CKPT_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
  FlatShardingSpec spec;
  spec.unsharded_shape.assign(shape.begin(), shape.end());
  spec.unsharded_flattened_offsets.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(FlatRange range, EvenFlatRange(numel, world_size, r));
    spec.unsharded_flattened_offsets.push_back({range});
  }
  return spec;
}

absl::StatusOr<FlatRange> EvenFlatRange(int64_t numel, int64_t world_size, int64_t rank) {
  if (numel < 0 || numel > kMaxElements || world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("no even flat range for rank ", rank, " of ",
                                                   world_size, " ranks over ", numel, " elements"));
  }
  const int64_t chunk = numel / world_size + (numel % world_size != 0 ? 1 : 0);
  // No overflow: with chunk >= 2, world_size < numel <= 2^62 and rank * chunk < numel +
  // world_size; with chunk <= 1, rank * chunk <= rank.
  const int64_t start = std::min(numel, rank * chunk);
  return FlatRange{start, std::min(numel, start + chunk)};
}

absl::StatusOr<std::vector<CopyRun>> ShardedChunkRuns(const FlatShardingSpec& spec, int rank) {
  CKPT_RETURN_IF_ERROR(CheckRank(spec, rank));
  CKPT_RETURN_IF_ERROR(ValidateFlatSharding(spec, /*require_complete=*/false));
  std::vector<CopyRun> runs;
  int64_t local = 0;
  for (const FlatRange& r : spec.unsharded_flattened_offsets[rank]) {
    if (r.size() == 0) continue;
    if (!runs.empty() && runs.back().src_offset + runs.back().length == r.start) {
      runs.back().length += r.size();
    } else {
      runs.push_back(CopyRun{r.start, local, r.size()});
    }
    local += r.size();
  }
  return runs;
}

absl::StatusOr<std::vector<char>> ShardedChunk(const FlatShardingSpec& spec, int rank,
                                               int64_t elem_size,
                                               absl::Span<const char> unsharded) {
  CKPT_RETURN_IF_ERROR(CheckBuffer(spec, elem_size, unsharded.size()));
  CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs, ShardedChunkRuns(spec, rank));
  std::vector<char> out(spec.sharded_numels()[rank] * elem_size);
  CopyRuns(runs, elem_size, unsharded.data(), out.data());
  return out;
}

absl::StatusOr<std::vector<std::vector<char>>> ChunkUnsharded(const FlatShardingSpec& spec,
                                                              int64_t elem_size,
                                                              absl::Span<const char> unsharded,
                                                              bool pad) {
  CKPT_RETURN_IF_ERROR(CheckBuffer(spec, elem_size, unsharded.size()));
  const std::vector<int64_t> numels = spec.sharded_numels();
  const int64_t max_numel = numels.empty() ? 0 : *std::max_element(numels.begin(), numels.end());
  std::vector<std::vector<char>> chunks;
  for (int rank = 0; rank < spec.world_size(); ++rank) {
    CKPT_ASSIGN_OR_RETURN(std::vector<char> chunk, ShardedChunk(spec, rank, elem_size, unsharded));
    if (pad) chunk.resize(max_numel * elem_size, 0);
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

absl::StatusOr<std::vector<char>> Unshard(const FlatShardingSpec& spec, int64_t elem_size,
                                          absl::Span<const std::vector<char>> shards) {
  CKPT_RETURN_IF_ERROR(ValidateFlatSharding(spec, /*require_complete=*/true));
  if (elem_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", elem_size, " is not >= 1"));
  }
  if (static_cast<int>(shards.size()) != spec.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", shards.size(), " shards for ", spec.world_size(), " ranks"));
  }
  CKPT_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(spec.unsharded_shape));
  const std::vector<int64_t> numels = spec.sharded_numels();
  std::vector<char> out(numel * elem_size);
  for (int rank = 0; rank < spec.world_size(); ++rank) {
    if (static_cast<int64_t>(shards[rank].size()) < numels[rank] * elem_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, "'s shard has ",
                                                     shards[rank].size(), " bytes, needs ",
                                                     numels[rank] * elem_size));
    }
    int64_t local = 0;
    for (const FlatRange& r : spec.unsharded_flattened_offsets[rank]) {
      std::memcpy(out.data() + r.start * elem_size, shards[rank].data() + local * elem_size,
                  r.size() * elem_size);
      local += r.size();
    }
  }
  return out;
}

std::vector<Region> FlatShardRegions(const FlatShardingSpec& spec, int rank) {
  std::vector<Region> regions;
  if (rank < 0 || rank >= spec.world_size()) return regions;
  for (const FlatRange& r : spec.unsharded_flattened_offsets[rank]) {
    if (r.size() > 0) regions.push_back(FlatRangeRegion(spec.unsharded_shape, r));
  }
  return regions;
}

Region FlatRangeRegion(absl::Span<const int64_t> shape, FlatRange range) {
  Region r = WholeRegion(shape);
  r.flat = range;
  return r;
}

std::vector<FlatSubBox> FlatRangeToBoxes(const Region& box, FlatRange range) {
  std::vector<FlatSubBox> out;
  if (range.start >= range.stop) return out;
  const int n = box.ndim();
  if (n == 0) {
    out.push_back(FlatSubBox{box, 0});
    out.back().box.flat.reset();
    return out;
  }
  std::vector<int64_t> stride(n);
  int64_t s = 1;
  for (int j = n - 1; j >= 0; --j) {
    stride[j] = s;
    s *= box.lengths[j];
  }
  const int64_t total = s;
  // Emits [from, to) at level j: dims < j fixed at from's digits, dim j partial, dims > j
  // full. from and to are multiples of stride[j] inside one stride[j - 1] block.
  auto emit = [&](int j, int64_t from, int64_t to) {
    FlatSubBox sub;
    sub.local_start = from - range.start;
    sub.box.offsets.resize(n);
    sub.box.lengths.resize(n);
    for (int k = 0; k < n; ++k) {
      if (k < j) {
        sub.box.offsets[k] = box.offsets[k] + (from / stride[k]) % box.lengths[k];
        sub.box.lengths[k] = 1;
      } else if (k == j) {
        sub.box.offsets[k] = box.offsets[k] + (from / stride[k]) % box.lengths[k];
        sub.box.lengths[k] = (to - from) / stride[k];
      } else {
        sub.box.offsets[k] = box.offsets[k];
        sub.box.lengths[k] = box.lengths[k];
      }
    }
    out.push_back(std::move(sub));
  };
  int64_t cur = range.start;
  int level = n - 1;
  // Ascending: complete partial blocks until the range's end lies inside the current block.
  for (; level >= 0; --level) {
    const int64_t upper =
        level == 0 ? total : (cur + stride[level - 1] - 1) / stride[level - 1] * stride[level - 1];
    if (range.stop <= upper) break;
    if (upper > cur) emit(level, cur, upper);
    cur = upper;
  }
  // Descending: whole blocks of decreasing size up to the range's end.
  for (int j = std::max(level, 0); j < n; ++j) {
    const int64_t end = range.stop / stride[j] * stride[j];
    if (end > cur) {
      emit(j, cur, end);
      cur = end;
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<BufferSlice>>> FlatBufferSharding(
    absl::Span<const int64_t> tensor_numels, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " is not >= 1"));
  }
  int64_t total = 0;
  for (size_t t = 0; t < tensor_numels.size(); ++t) {
    if (tensor_numels[t] < 0 || tensor_numels[t] > kMaxElements - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t, " of the flat buffer has ", tensor_numels[t],
                       " elements; counts must be >= 0 and the buffer at most 2^62 elements"));
    }
    total += tensor_numels[t];
  }
  const int64_t per_rank = total / world_size + (total % world_size != 0 ? 1 : 0);
  std::vector<std::vector<BufferSlice>> slices(world_size);
  int64_t tensor_start = 0;
  for (size_t t = 0; t < tensor_numels.size(); ++t) {
    const int64_t tensor_end = tensor_start + tensor_numels[t];
    // Ranks whose part [r * per_rank, (r + 1) * per_rank) meets [tensor_start, tensor_end).
    for (int64_t r = per_rank == 0 ? world_size : tensor_start / per_rank;
         r < world_size && r * per_rank < tensor_end; ++r) {
      const int64_t lo = std::max(tensor_start, r * per_rank);
      const int64_t hi = std::min(tensor_end, (r + 1) * per_rank);
      if (hi > lo) {
        slices[r].push_back(BufferSlice{static_cast<int>(t),
                                        FlatRange{lo - tensor_start, hi - tensor_start},
                                        lo - r * per_rank});
      }
    }
    tensor_start = tensor_end;
  }
  return slices;
}

}  // namespace ckpt
