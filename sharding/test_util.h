// Brute-force element-index model and random generators shared by sharding/ property tests.
#ifndef CKPT_SHARDING_TEST_UTIL_H_
#define CKPT_SHARDING_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "sharding/region.h"

namespace ckpt {
namespace testing {

// Global row-major flat indices of the elements a piece with `region` holds, in its local
// storage order (the storage convention of sharding/overlap.h).
std::vector<int64_t> HeldGlobalIndices(const Region& region,
                                       absl::Span<const int64_t> global_shape);

// A random shape with 0..max_ndim dims of size 0..max_dim.
std::vector<int64_t> RandomShape(std::mt19937_64& rng, int max_ndim, int64_t max_dim);

// A random box inside `shape` (possibly with zero-length dims).
Region RandomBox(std::mt19937_64& rng, absl::Span<const int64_t> shape);

// A random box, with a random flat range of it with probability `flat_probability`.
Region RandomRegion(std::mt19937_64& rng, absl::Span<const int64_t> shape, double flat_probability);

// Uniform integer in [lo, hi].
int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi);

}  // namespace testing
}  // namespace ckpt

#endif  // CKPT_SHARDING_TEST_UTIL_H_
