// The exact coverage check against a brute-force twin that marks every element: random
// tensors of 0 to 4 dims, random tilings (boxes and flat ranges) mutated to leave holes and
// overlaps (including the "relabelled piece" that hides a hole behind an overlap of the same
// size, which a count of elements misses), and arbitrary random pieces.
#include "sharding/coverage.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// How many pieces store each element (row-major), by visiting every element of every piece.
std::vector<int> Marks(const std::vector<int64_t>& shape, const std::vector<Region>& pieces) {
  std::vector<int> marks(Numel(shape), 0);
  for (const Region& r : pieces) {
    const int d = r.ndim();
    std::vector<int64_t> idx(d, 0);
    for (int64_t i = 0; i < r.BoxElements(); ++i) {
      if (!r.flat || (i >= r.flat->start && i < r.flat->stop)) {
        int64_t g = 0;
        for (int k = 0; k < d; ++k) g = g * shape[k] + r.offsets[k] + idx[k];
        ++marks[g];
      }
      for (int k = d - 1; k >= 0; --k) {
        if (++idx[k] < r.lengths[k]) break;
        idx[k] = 0;
      }
    }
  }
  return marks;
}

// Splits `box` recursively into a random tiling; some leaves become several flat ranges.
void Tile(const Region& box, std::mt19937& rng, std::vector<Region>* out, int depth = 0) {
  const int d = box.ndim();
  std::vector<int> splittable;
  for (int k = 0; k < d; ++k) {
    if (box.lengths[k] >= 2) splittable.push_back(k);
  }
  if (splittable.empty() || depth > 3 || rng() % 3 == 0) {
    const int64_t n = box.BoxElements();
    if (n >= 2 && rng() % 2 == 0) {  // flat ranges of this box
      int64_t at = 0;
      while (at < n) {
        const int64_t stop = std::min<int64_t>(n, at + 1 + rng() % n);
        Region r = box;
        r.flat = FlatRange{at, stop};
        out->push_back(r);
        at = stop;
      }
    } else {
      out->push_back(box);
    }
    return;
  }
  const int k = splittable[rng() % splittable.size()];
  const int64_t cut = 1 + rng() % (box.lengths[k] - 1);
  Region a = box, b = box;
  a.lengths[k] = cut;
  b.offsets[k] += cut;
  b.lengths[k] -= cut;
  Tile(a, rng, out, depth + 1);
  Tile(b, rng, out, depth + 1);
}

Region RandomRegion(const std::vector<int64_t>& shape, std::mt19937& rng) {
  Region r;
  for (int64_t s : shape) {
    const int64_t off = s == 0 ? 0 : rng() % s;
    r.offsets.push_back(off);
    r.lengths.push_back(rng() % (s - off + 1));
  }
  const int64_t n = r.BoxElements();
  if (n > 0 && rng() % 2 == 0) {
    const int64_t a = rng() % (n + 1);
    r.flat = FlatRange{a, a + static_cast<int64_t>(rng() % (n - a + 1))};
  }
  return r;
}

void Mutate(const std::vector<int64_t>& shape, std::mt19937& rng, std::vector<Region>* pieces) {
  if (pieces->empty()) return;
  const size_t p = rng() % pieces->size();
  switch (rng() % 5) {
    case 0:  // drop a piece: a hole
      pieces->erase(pieces->begin() + p);
      break;
    case 1:  // store a piece twice: an overlap
      pieces->push_back((*pieces)[p]);
      break;
    case 2: {  // relabel a piece to another place of the same size: hole + overlap
      Region& r = (*pieces)[p];
      for (int k = 0; k < r.ndim(); ++k) {
        const int64_t room = shape[k] - r.lengths[k];
        if (room > 0) r.offsets[k] = rng() % (room + 1);
      }
      if (r.flat) {
        const int64_t n = r.flat->size(), box = r.BoxElements();
        const int64_t start = rng() % (box - n + 1);
        r.flat = FlatRange{start, start + n};
      }
      break;
    }
    case 3:  // an extra random piece
      pieces->push_back(RandomRegion(shape, rng));
      break;
    default:
      break;
  }
}

void ExpectMatchesBruteForce(const std::vector<int64_t>& shape, const std::vector<Region>& pieces) {
  std::string what = "shape " + ShapeString(shape) + " pieces";
  for (const Region& r : pieces) what += " " + r.DebugString();
  SCOPED_TRACE(what);
  for (const Region& r : pieces) ASSERT_TRUE(ValidateRegion(r, shape).ok());
  const std::vector<int> marks = Marks(shape, pieces);
  auto fault = FindCoverageFault(shape, pieces, CoverageTermBudget(pieces.size()));
  ASSERT_TRUE(fault.ok()) << fault.status();
  const auto bad = std::find_if(marks.begin(), marks.end(), [](int m) { return m != 1; });
  if (bad == marks.end()) {
    EXPECT_FALSE(fault->has_value()) << (*fault)->first;
    return;
  }
  ASSERT_TRUE(fault->has_value());
  const CoverageFault& f = **fault;
  const int64_t first = bad - marks.begin();
  EXPECT_EQ(f.first, first);
  EXPECT_EQ(f.copies, *bad);
  if (*bad == 0) {
    int64_t end = first;
    while (end < static_cast<int64_t>(marks.size()) && marks[end] == 0) ++end;
    EXPECT_EQ(f.end, end);
    EXPECT_TRUE(f.pieces.empty());
  } else {
    EXPECT_EQ(f.end, first + 1);
    ASSERT_EQ(f.pieces.size(), 2u);
    for (int p : f.pieces) {
      std::vector<Region> one = {pieces[p]};
      EXPECT_EQ(Marks(shape, one)[first], 1) << "piece " << p << " does not store the element";
    }
  }
  int64_t index = 0;
  for (size_t k = 0; k < shape.size(); ++k) index = index * shape[k] + f.element[k];
  EXPECT_EQ(index, first);
}

TEST(CoverageTest, MatchesBruteForceOnRandomTilingsHolesAndOverlaps) {
  std::mt19937 rng(20261123);
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<int64_t> shape(rng() % 5);
    for (int64_t& s : shape) s = rng() % 7 == 0 ? 1 : 1 + rng() % 6;
    std::vector<Region> pieces;
    if (rng() % 8 == 0) {
      for (int n = rng() % 6; n > 0; --n) pieces.push_back(RandomRegion(shape, rng));
    } else {
      Tile(WholeRegion(shape), rng, &pieces);
      for (int m = rng() % 3; m > 0; --m) Mutate(shape, rng, &pieces);
    }
    std::shuffle(pieces.begin(), pieces.end(), rng);
    ExpectMatchesBruteForce(shape, pieces);
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
}

TEST(CoverageTest, AnOverlapHidingAHoleOfTheSameSizeIsFound) {
  // Rows 0:2 and 2:4 of a (4, 3) tensor; the second relabelled as rows 1:3. A count of
  // elements (12) sees nothing wrong.
  const std::vector<int64_t> shape = {4, 3};
  const std::vector<Region> pieces = {Region{{0, 0}, {2, 3}, std::nullopt},
                                      Region{{1, 0}, {2, 3}, std::nullopt}};
  absl::Status s = CheckExactCoverage("w", shape, pieces);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor \"w\" (4, 3): element (1, 0) is stored by 2 pieces (an overlap): "
                        "[0:2, 0:3] and [1:3, 0:3]"));
  const std::vector<Region> hole = {Region{{0, 0}, {2, 3}, std::nullopt},
                                    Region{{3, 0}, {1, 3}, std::nullopt}};
  s = CheckExactCoverage("w", shape, hole);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("elements [6, 9) in row-major order are stored by no piece (a hole from "
                        "(2, 0) to (2, 2))"));
}

TEST(CoverageTest, ZeroDimensionalAndEmptyTensors) {
  EXPECT_TRUE(CheckExactCoverage("s", {}, {Region{}}).ok());
  EXPECT_FALSE(CheckExactCoverage("s", {}, {}).ok());
  EXPECT_FALSE(CheckExactCoverage("s", {}, {Region{}, Region{}}).ok());
  EXPECT_TRUE(CheckExactCoverage("e", {0, 3}, {}).ok());  // nothing to store
}

TEST(CoverageTest, PiecesCutAlongTooManyDimensionsAreRefusedNotExploded) {
  // 2^40 corner terms for one piece: refused with a bounded amount of work.
  const std::vector<int64_t> shape(40, 2);
  Region r;
  r.offsets.assign(40, 0);
  r.lengths.assign(40, 1);
  auto fault = FindCoverageFault(shape, {r}, CoverageTermBudget(1));
  EXPECT_EQ(fault.status().code(), absl::StatusCode::kResourceExhausted);
  // A legitimately large tiling within budget: 1M row pieces of a (1M, 4) tensor.
  std::vector<Region> rows;
  for (int64_t i = 0; i < (int64_t{1} << 20); ++i) {
    rows.push_back(Region{{i, 0}, {1, 4}, std::nullopt});
  }
  auto ok = FindCoverageFault({int64_t{1} << 20, 4}, rows, CoverageTermBudget(rows.size()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->has_value());
}

TEST(CoverageTest, RunTilingMatchesBruteForce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    const int64_t total = rng() % 12;
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int n = rng() % 5; n > 0; --n) {
      const int64_t off = rng() % (total + 2);
      runs.emplace_back(off, rng() % 5);
    }
    std::vector<int> marks(total + 8, 0);
    for (const auto& [off, len] : runs) {
      for (int64_t i = off; i < off + len; ++i) ++marks[i];
    }
    std::optional<RunFault> fault = FindRunTilingFault(runs, total);
    int64_t first = -1;
    for (int64_t i = 0; i < static_cast<int64_t>(marks.size()); ++i) {
      if ((i < total && marks[i] != 1) || (i >= total && marks[i] != 0)) {
        first = i;
        break;
      }
    }
    if (first < 0) {
      EXPECT_FALSE(fault.has_value());
      continue;
    }
    ASSERT_TRUE(fault.has_value()) << "total " << total << " first bad " << first;
    EXPECT_EQ(fault->offset, first);
    EXPECT_EQ(fault->hole, first < total && marks[first] == 0);
  }
}

}  // namespace
}  // namespace ckpt
