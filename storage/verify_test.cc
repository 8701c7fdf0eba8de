#include "storage/verify.h"

#include <random>

#include "gtest/gtest.h"
#include "sharding/overlap.h"
#include "storage/manifest_codec.h"

namespace ckpt {
namespace {

// Brute force: count how many pieces store each element (flat index into the tensor).
bool ExactlyOnceBruteForce(const std::vector<Region>& pieces, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int> count(n, 0);
  for (const Region& r : pieces) {
    const int nd = r.ndim();
    std::vector<int64_t> idx(nd, 0);
    for (int64_t i = 0; i < r.BoxElements(); ++i) {
      if (!r.flat || (i >= r.flat->start && i < r.flat->stop)) {
        int64_t g = 0;
        for (int d = 0; d < nd; ++d) g = g * shape[d] + r.offsets[d] + idx[d];
        ++count[g];
      }
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < r.lengths[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (int c : count) {
    if (c != 1) return false;
  }
  return true;
}

pb::Manifest ManifestOf(const std::vector<Region>& pieces, const std::vector<int64_t>& shape) {
  pb::Manifest m;
  auto* t = m.add_tensors();
  t->set_key("t");
  t->set_dtype(pb::DTYPE_U8);
  for (int64_t d : shape) t->add_global_shape(d);
  for (const Region& r : pieces) {
    auto* p = m.add_pieces();
    p->set_key("t");
    *p->mutable_region() = RegionToProto(r);
  }
  return m;
}

// Random tilings (rows split into boxes, some boxes split into flat ranges), sometimes
// perturbed by dropping or duplicating a piece or shifting a boundary.
TEST(VerifyTest, CoverageCheckAgreesWithBruteForce) {
  std::mt19937 rng(17);
  int sound = 0, broken = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const std::vector<int64_t> shape = {1 + static_cast<int64_t>(rng() % 6),
                                        1 + static_cast<int64_t>(rng() % 5)};
    std::vector<Region> pieces;
    for (int64_t row = 0; row < shape[0];) {
      const int64_t rows = 1 + rng() % (shape[0] - row);
      Region box{{row, 0}, {rows, shape[1]}, std::nullopt};
      if (rng() % 2) {
        const int64_t n = box.BoxElements(), cut = rng() % (n + 1);
        Region a = box, b = box;
        a.flat = FlatRange{0, cut};
        b.flat = FlatRange{cut, n};
        pieces.push_back(a);
        pieces.push_back(b);
      } else {
        pieces.push_back(box);
      }
      row += rows;
    }
    switch (rng() % 4) {
      case 0:
        pieces.erase(pieces.begin() + rng() % pieces.size());
        break;
      case 1:
        pieces.push_back(pieces[rng() % pieces.size()]);
        break;
      case 2: {
        Region& r = pieces[rng() % pieces.size()];
        if (r.flat && r.flat->stop > r.flat->start) --r.flat->stop;
        break;
      }
      default:
        break;
    }
    auto problems = CheckCoverage(ManifestOf(pieces, shape));
    ASSERT_TRUE(problems.ok()) << problems.status();
    const bool exact = ExactlyOnceBruteForce(pieces, shape);
    EXPECT_EQ(problems->empty(), exact) << "iteration " << iter;
    (exact ? sound : broken)++;
  }
  EXPECT_GT(sound, 100);
  EXPECT_GT(broken, 100);
}

TEST(VerifyTest, ScalarNeedsExactlyOnePiece) {
  EXPECT_TRUE(CheckCoverage(ManifestOf({Region{}}, {}))->empty());
  EXPECT_FALSE(CheckCoverage(ManifestOf({}, {}))->empty());
  EXPECT_FALSE(CheckCoverage(ManifestOf({Region{}, Region{}}, {}))->empty());
  EXPECT_TRUE(CheckCoverage(ManifestOf({}, {0, 3}))->empty());  // nothing to store
}

}  // namespace
}  // namespace ckpt
