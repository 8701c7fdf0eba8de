// Splits a region into chunks that each lie contiguously in the region's own storage (the
// row-major flattening of its box, restricted to its flat range), so that a large read into a
// trainer's tensor can go a bounded chunk at a time (and stop between chunks). Pure.
#ifndef CKPT_WORKER_REGION_CHUNKS_H_
#define CKPT_WORKER_REGION_CHUNKS_H_

#include <cstdint>
#include <vector>

#include "sharding/region.h"

namespace ckpt::worker {

// A part of a region; its elements are local elements [first_element, first_element +
// region.NumElements()) of the region it was cut from.
struct RegionChunk {
  Region region;
  int64_t first_element = 0;
};

// Chunks of at most `max_elements` (>= 1) elements each, in storage order, covering `region`
// exactly. Box regions are cut into slabs along the outermost dimension whose inner block
// fits (dimensions before it fixed one index at a time); flat regions into flat sub-ranges.
// An empty region gives no chunks. `region` must be valid.
std::vector<RegionChunk> SplitRegion(const Region& region, int64_t max_elements);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_REGION_CHUNKS_H_
