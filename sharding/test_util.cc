#include "sharding/test_util.h"

namespace ckpt {
namespace testing {

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

std::vector<int64_t> HeldGlobalIndices(const Region& region,
                                       absl::Span<const int64_t> global_shape) {
  const int n = static_cast<int>(global_shape.size());
  std::vector<int64_t> box;  // global indices of the box, row-major
  const int64_t count = region.BoxElements();
  std::vector<int64_t> idx(n, 0);
  for (int64_t e = 0; e < count; ++e) {
    int64_t g = 0;
    for (int j = 0; j < n; ++j) g = g * global_shape[j] + region.offsets[j] + idx[j];
    box.push_back(g);
    for (int j = n - 1; j >= 0; --j) {
      if (++idx[j] < region.lengths[j]) break;
      idx[j] = 0;
    }
  }
  if (!region.flat) return box;
  return std::vector<int64_t>(box.begin() + region.flat->start, box.begin() + region.flat->stop);
}

std::vector<int64_t> RandomShape(std::mt19937_64& rng, int max_ndim, int64_t max_dim) {
  std::vector<int64_t> shape(Uniform(rng, 0, max_ndim));
  for (int64_t& d : shape) d = Uniform(rng, 0, max_dim);
  return shape;
}

Region RandomBox(std::mt19937_64& rng, absl::Span<const int64_t> shape) {
  Region r;
  for (int64_t d : shape) {
    if (Uniform(rng, 0, 2) == 0) {  // full dims make merged runs likely
      r.offsets.push_back(0);
      r.lengths.push_back(d);
      continue;
    }
    const int64_t a = Uniform(rng, 0, d);
    const int64_t b = Uniform(rng, 0, d);
    r.offsets.push_back(std::min(a, b));
    r.lengths.push_back(std::max(a, b) - std::min(a, b));
  }
  return r;
}

Region RandomRegion(std::mt19937_64& rng, absl::Span<const int64_t> shape,
                    double flat_probability) {
  Region r = RandomBox(rng, shape);
  if (std::uniform_real_distribution<double>(0, 1)(rng) < flat_probability) {
    const int64_t n = r.BoxElements();
    const int64_t a = Uniform(rng, 0, n);
    const int64_t b = Uniform(rng, 0, n);
    r.flat = FlatRange{std::min(a, b), std::max(a, b)};
  }
  return r;
}

}  // namespace testing
}  // namespace ckpt
