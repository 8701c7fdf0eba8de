#include "sharding/layout.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/dtensor.h"
#include "sharding/flat_sharding.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using testing::HeldGlobalIndices;
using testing::Uniform;
using V = std::vector<int64_t>;

TensorPiece Piece(int64_t rank, Region region, V replica = {}, V shape = {8, 4},
                  DType dtype = DType::kF32) {
  return TensorPiece{"w", rank, dtype, std::move(shape), std::move(region), std::move(replica)};
}

Region Box(V offsets, V lengths, std::optional<FlatRange> flat = std::nullopt) {
  return Region{std::move(offsets), std::move(lengths), flat};
}

bool Has(const std::vector<LayoutIssue>& issues, LayoutIssue::Kind kind, absl::string_view text) {
  for (const auto& i : issues) {
    if (i.kind == kind && absl::string_view(i.message).find(text) != absl::string_view::npos)
      return true;
  }
  return false;
}

std::string All(const std::vector<LayoutIssue>& issues) {
  std::string s;
  for (const auto& i : issues) s += i.message + "\n";
  return s;
}

TEST(LayoutTest, DTensorLayoutWithReplicasIsValid) {
  auto mesh = DeviceMesh::Create({2, 3});
  ASSERT_TRUE(mesh.ok());
  auto shards = ComputeAllLocalShards({7, 5}, *mesh, {Placement::Shard(0), Placement::Replicate()});
  ASSERT_TRUE(shards.ok());
  std::vector<TensorPiece> pieces;
  for (int r = 0; r < 6; ++r) {
    pieces.push_back(Piece(r, (*shards)[r].region(), (*shards)[r].replica_id, {7, 5}));
  }
  EXPECT_TRUE(CheckTensorLayout(pieces).empty()) << All(CheckTensorLayout(pieces));
  EXPECT_TRUE(ValidateLayout(pieces).ok());
}

TEST(LayoutTest, FlatShardsInsideTensorParallelBoxesAreValid) {
  // TP=2 along dim 1, each TP box flat-sharded over DP=3 (ZeRO-1 style).
  std::vector<TensorPiece> pieces;
  for (int tp = 0; tp < 2; ++tp) {
    auto spec = EvenFlatSharding({8, 2}, 3);
    ASSERT_TRUE(spec.ok());
    for (int dp = 0; dp < 3; ++dp) {
      pieces.push_back(
          Piece(tp * 3 + dp, Box({0, 2 * tp}, {8, 2}, spec->unsharded_flattened_offsets[dp][0])));
    }
  }
  EXPECT_TRUE(CheckTensorLayout(pieces).empty()) << All(CheckTensorLayout(pieces));
}

TEST(LayoutTest, DisagreementsNameTheRanks) {
  std::vector<TensorPiece> pieces = {
      Piece(1, Box({4, 0}, {4, 4}), {}, {8, 4}, DType::kBF16),
      Piece(0, Box({0, 0}, {4, 4})),
      Piece(2, Box({0, 0}, {4, 4}), {1}, {8, 5}),
      Piece(3, Box({6, 0}, {4, 4}), {1}),
  };
  auto issues = CheckTensorLayout(pieces);
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kDTypeMismatch,
                  "tensor 'w': rank 1 reports dtype BF16 but rank 0 reports F32"))
      << All(issues);
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kShapeMismatch,
                  "rank 2 reports global shape (8, 5) but rank 0 reports (8, 4)"))
      << All(issues);
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kInvalidRegion, "rank 3")) << All(issues);
  // Rows 4..7 are then covered by no valid main replica.
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kHole, "starting at element (4, 0)")) << All(issues);
}

TEST(LayoutTest, OverlappingMainReplicasAreReported) {
  std::vector<TensorPiece> pieces = {
      Piece(0, Box({0, 0}, {5, 4})), Piece(1, Box({4, 0}, {4, 4})),
      Piece(2, Box({0, 0}, {8, 4}), {1}),  // a replica may overlap anything
  };
  auto issues = CheckTensorLayout(pieces);
  ASSERT_EQ(issues.size(), 1u) << All(issues);
  EXPECT_EQ(issues[0].kind, LayoutIssue::Kind::kOverlap);
  EXPECT_EQ(issues[0].message,
            "tensor 'w': main replicas overlap in 4 elements: rank 0 [0:5, 0:4] and rank 1 "
            "[4:8, 0:4]");
}

TEST(LayoutTest, FlatOverlapIsFoundAtElementLevel) {
  std::vector<TensorPiece> pieces = {
      Piece(0, Box({0, 0}, {8, 4}, FlatRange{0, 17})),
      Piece(1, Box({0, 0}, {8, 4}, FlatRange{16, 32})),
  };
  auto issues = CheckTensorLayout(pieces);
  ASSERT_EQ(issues.size(), 1u) << All(issues);
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kOverlap, "overlap in 1 elements")) << All(issues);
}

TEST(LayoutTest, HoleNamesItsFirstElementAndSize) {
  std::vector<TensorPiece> pieces = {
      Piece(0, Box({0, 0}, {8, 4}, FlatRange{0, 9})),
      Piece(1, Box({0, 0}, {8, 4}, FlatRange{12, 32})),
  };
  auto issues = CheckTensorLayout(pieces);
  ASSERT_EQ(issues.size(), 1u) << All(issues);
  EXPECT_EQ(issues[0].message,
            "tensor 'w' of shape (8, 4): 3 elements are held by no main replica; the first hole "
            "is flat elements [9, 12) starting at element (2, 1)");
  absl::Status st = ValidateLayout(pieces);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

TEST(LayoutTest, ZeroDimAndEmptyTensors) {
  EXPECT_TRUE(CheckTensorLayout({Piece(0, Box({}, {}), {}, {})}).empty());
  EXPECT_FALSE(CheckTensorLayout({Piece(0, Box({}, {}, FlatRange{0, 0}), {}, {})}).empty());
  EXPECT_TRUE(CheckTensorLayout({Piece(0, Box({0}, {0}), {}, {0})}).empty());
}

TEST(LayoutTest, IssueCountIsCapped) {
  std::vector<TensorPiece> pieces;
  for (int r = 0; r < 50; ++r) pieces.push_back(Piece(r, Box({0, 0}, {8, 4})));
  EXPECT_EQ(CheckTensorLayout(pieces, 5).size(), 5u);
}

// Property test: random main pieces vs an element count model.
TEST(LayoutTest, AgreesWithElementCountModel) {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 3000; ++iter) {
    V shape = testing::RandomShape(rng, 3, 6);
    std::vector<TensorPiece> pieces;
    const int n = Uniform(rng, 0, 6);
    for (int r = 0; r < n; ++r) {
      pieces.push_back(Piece(r, testing::RandomRegion(rng, shape, 0.5), {}, shape));
    }
    // Sometimes a complete layout: tile the flattening with random cut points.
    if (Uniform(rng, 0, 2) == 0) {
      pieces.clear();
      const int64_t total = WholeRegion(shape).BoxElements();
      int64_t at = 0;
      for (int r = 0; at < total || r == 0; ++r) {
        const int64_t next = r == 5 ? total : Uniform(rng, at, total);
        pieces.push_back(Piece(r, Box(V(shape.size(), 0), shape, FlatRange{at, next}), {}, shape));
        at = next;
      }
    }
    if (pieces.empty()) {  // nothing names the tensor: nothing to check
      ASSERT_TRUE(CheckTensorLayout(pieces).empty());
      continue;
    }
    std::vector<int> count(WholeRegion(shape).BoxElements(), 0);
    for (const auto& p : pieces) {
      for (int64_t g : HeldGlobalIndices(p.region, shape)) ++count[g];
    }
    const bool overlap = std::any_of(count.begin(), count.end(), [](int c) { return c > 1; });
    const bool hole = std::any_of(count.begin(), count.end(), [](int c) { return c == 0; });
    auto issues = CheckTensorLayout(pieces, 1000);
    SCOPED_TRACE(ShapeString(shape) + "\n" + All(issues));
    bool got_overlap = false, got_hole = false;
    for (const auto& i : issues) {
      got_overlap |= i.kind == LayoutIssue::Kind::kOverlap;
      got_hole |= i.kind == LayoutIssue::Kind::kHole;
    }
    ASSERT_EQ(got_overlap, overlap);
    if (!overlap) {
      ASSERT_EQ(got_hole, hole);
      if (hole) {
        const int64_t first = std::find(count.begin(), count.end(), 0) - count.begin();
        ASSERT_TRUE(Has(issues, LayoutIssue::Kind::kHole,
                        absl::StrCat("first hole is flat elements [", first, ", ")));
      }
    }
  }
}

TEST(LayoutTest, LargeLayoutsAreCheckedBySweepNotAllPairs) {
  // 200 x 200 grid of tiles = 40000 pieces; all pairs would be 8e8 checks.
  std::vector<TensorPiece> pieces;
  for (int i = 0; i < 200; ++i) {
    for (int j = 0; j < 200; ++j) {
      pieces.push_back(Piece(i * 200 + j, Box({i * 3, j * 2}, {3, 2}), {}, {600, 400}));
    }
  }
  EXPECT_TRUE(CheckTensorLayout(pieces).empty());
  pieces.back().region.lengths[1] = 1;
  auto issues = CheckTensorLayout(pieces);
  EXPECT_TRUE(Has(issues, LayoutIssue::Kind::kHole, "starting at element (597, 399)"))
      << All(issues);
}

}  // namespace
}  // namespace ckpt
