#include "worker/region_chunks.h"

#include <algorithm>

namespace ckpt::worker {
namespace {

// Appends the chunks of `box` (no flat range) whose dimensions before `dim` have length 1.
void SplitBox(const Region& box, int dim, int64_t max_elements, int64_t* next_element,
              std::vector<RegionChunk>* out) {
  int64_t inner = 1;
  for (int d = dim + 1; d < box.ndim(); ++d) inner *= box.lengths[d];
  const int64_t length = box.lengths[dim];
  if (inner <= max_elements) {
    const int64_t step = std::max<int64_t>(1, max_elements / inner);
    for (int64_t at = 0; at < length; at += step) {
      RegionChunk chunk{box, *next_element};
      chunk.region.offsets[dim] = box.offsets[dim] + at;
      chunk.region.lengths[dim] = std::min(step, length - at);
      *next_element += chunk.region.lengths[dim] * inner;
      out->push_back(std::move(chunk));
    }
    return;
  }
  for (int64_t i = 0; i < length; ++i) {
    Region slice = box;
    slice.offsets[dim] = box.offsets[dim] + i;
    slice.lengths[dim] = 1;
    SplitBox(slice, dim + 1, max_elements, next_element, out);
  }
}

}  // namespace

std::vector<RegionChunk> SplitRegion(const Region& region, int64_t max_elements) {
  max_elements = std::max<int64_t>(max_elements, 1);
  std::vector<RegionChunk> out;
  if (region.NumElements() <= 0) return out;
  if (region.flat.has_value()) {
    for (int64_t at = region.flat->start; at < region.flat->stop; at += max_elements) {
      RegionChunk chunk{region, at - region.flat->start};
      chunk.region.flat = FlatRange{at, std::min(region.flat->stop, at + max_elements)};
      out.push_back(std::move(chunk));
    }
    return out;
  }
  if (region.ndim() == 0) {
    out.push_back(RegionChunk{region, 0});
    return out;
  }
  int64_t next_element = 0;
  SplitBox(region, 0, max_elements, &next_element, &out);
  return out;
}

}  // namespace ckpt::worker
