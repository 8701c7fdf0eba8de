#include "planner/save_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// Value of element g (global row-major index) of tensor `key`: distinct per key and element.
double Value(const std::string& key, int64_t g) {
  return static_cast<double>(std::hash<std::string>()(key) % 1000) * 1e6 + g;
}

using testing::HeldGlobalIndices;

TensorPiece Piece(std::string key, int64_t rank, std::vector<int64_t> shape, Region region,
                  std::vector<int64_t> replica = {}, DType dtype = DType::kF32) {
  TensorPiece p;
  p.key = std::move(key);
  p.rank = rank;
  p.dtype = dtype;
  p.global_shape = std::move(shape);
  p.region = std::move(region);
  p.replica_id = std::move(replica);
  return p;
}

// TP=2 x DP=2 over 4 ranks: "w" (8, 6) split on dim 0 over TP and replicated over DP; "b" (6,)
// replicated everywhere; "opt" (4, 5) flat-sharded unevenly over all ranks.
std::vector<TensorPiece> MegatronLikeLayout() {
  std::vector<TensorPiece> pieces;
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t tp = r % 2, dp = r / 2;
    pieces.push_back(Piece("w", r, {8, 6}, Region{{tp * 4, 0}, {4, 6}, std::nullopt}, {0, dp}));
    pieces.push_back(Piece("b", r, {6}, Region{{0}, {6}, std::nullopt}, {r}));
    const int64_t cuts[] = {0, 3, 3, 11, 20};  // rank 1's flat shard is empty
    pieces.push_back(
        Piece("opt", r, {4, 5}, Region{{0, 0}, {4, 5}, FlatRange{cuts[r], cuts[r + 1]}}));
  }
  return pieces;
}

// Executes the plan in memory: every writer copies its own copy of each planned piece into its
// files; then checks every element of every tensor was written exactly once with its value.
void ExpectPlanWritesEveryElementOnce(const std::vector<TensorPiece>& pieces,
                                      const SavePlan& plan) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorPiece& p : pieces) shapes[p.key] = p.global_shape;
  std::map<std::pair<std::string, int64_t>, int> written;
  std::map<std::pair<std::string, int64_t>, double> value;
  for (const WriterPlan& w : plan.writers) {
    for (const PlannedFile& f : w.files) {
      int64_t file_bytes = 0;
      for (const PlannedPiece& pp : f.pieces) {
        ASSERT_LT(pp.source_index, static_cast<int64_t>(pieces.size()));
        const TensorPiece& src = pieces[pp.source_index];
        ASSERT_EQ(src.rank, w.rank) << "writer must hold the piece it writes";
        ASSERT_EQ(src.region, pp.region);
        ASSERT_EQ(src.key, pp.key);
        // The writer's local data, as a trainer would hold it.
        const auto indices = HeldGlobalIndices(src.region, src.global_shape);
        EXPECT_EQ(pp.size_bytes, static_cast<int64_t>(indices.size()) * DTypeSize(pp.dtype));
        for (int64_t g : indices) {
          ++written[{pp.key, g}];
          value[{pp.key, g}] = Value(src.key, g);
        }
        file_bytes += pp.size_bytes;
      }
      EXPECT_EQ(file_bytes, f.total_bytes);
    }
  }
  for (const auto& [key, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t g = 0; g < n; ++g) {
      EXPECT_EQ(written[std::make_pair(key, g)], 1) << key << " element " << g;
      EXPECT_EQ(value[std::make_pair(key, g)], Value(key, g));
    }
  }
}

TEST(SavePlanTest, EveryElementWrittenOnceByAHolder) {
  const auto pieces = MegatronLikeLayout();
  auto plan = BuildSavePlan(pieces, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectPlanWritesEveryElementOnce(pieces, *plan);
}

TEST(SavePlanTest, ReplicatedPiecesSpreadOverTheirHolders) {
  // Each of 8 tensors is replicated on all 4 ranks with the main replica on rank 0: without
  // the distribution rank 0 would write everything.
  std::vector<TensorPiece> pieces;
  for (int t = 0; t < 8; ++t) {
    for (int64_t r = 0; r < 4; ++r) {
      pieces.push_back(
          Piece("t" + std::to_string(t), r, {16}, Region{{0}, {16}, std::nullopt}, {r}));
    }
  }
  auto plan = BuildSavePlan(pieces, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->writers.size(), 4u);
  for (const WriterPlan& w : plan->writers) EXPECT_EQ(w.total_bytes, 2 * 16 * 4);
  ExpectPlanWritesEveryElementOnce(pieces, *plan);
}

TEST(SavePlanTest, SmallWritersGetOneFileLargeOnesSeveralBalancedFiles) {
  std::vector<TensorPiece> pieces;
  // Rank 0: 10 pieces of 100 floats (400 bytes each); rank 1: one 4-float piece.
  for (int t = 0; t < 10; ++t) {
    pieces.push_back(Piece("big" + std::to_string(t), 0, {100}, Region{{0}, {100}, std::nullopt}));
  }
  pieces.push_back(Piece("small", 1, {4}, Region{{0}, {4}, std::nullopt}));
  SavePlanOptions options;
  options.target_file_bytes = 1000;  // 4000 bytes on rank 0 -> 4 files of ~1000
  auto plan = BuildSavePlan(pieces, 2, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->writers.size(), 2u);
  const WriterPlan& w0 = plan->writers[0];
  ASSERT_EQ(w0.files.size(), 4u);
  for (const PlannedFile& f : w0.files) {
    EXPECT_GE(f.total_bytes, 800);
    EXPECT_LE(f.total_bytes, 1200);
  }
  EXPECT_EQ(w0.files[0].path, "data/r0_0.safetensors");
  EXPECT_EQ(w0.files[3].path, "data/r0_3.safetensors");
  ASSERT_EQ(plan->writers[1].files.size(), 1u);
  EXPECT_EQ(plan->writers[1].files[0].path, "data/r1_0.safetensors");
  ExpectPlanWritesEveryElementOnce(pieces, *plan);
}

TEST(SavePlanTest, DefaultTargetKeepsTinyTensorsInOneFile) {
  std::vector<TensorPiece> pieces;
  for (int t = 0; t < 50; ++t) {
    pieces.push_back(Piece("n" + std::to_string(t), 0, {10}, Region{{0}, {10}, std::nullopt}));
  }
  auto plan = BuildSavePlan(pieces, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->writers.size(), 1u);
  ASSERT_EQ(plan->writers[0].files.size(), 1u);
  EXPECT_EQ(plan->writers[0].files[0].pieces.size(), 50u);
  // Pieces inside a file are in shard-id order.
  EXPECT_EQ(plan->writers[0].files[0].pieces[0].key, "n0");
  EXPECT_EQ(plan->writers[0].files[0].pieces[1].key, "n1");
  EXPECT_EQ(plan->writers[0].files[0].pieces[2].key, "n10");
}

TEST(SavePlanTest, OverlappingMainReplicasAreRejectedNamingTensorAndRanks) {
  std::vector<TensorPiece> pieces = {
      Piece("w", 0, {8}, Region{{0}, {5}, std::nullopt}),
      Piece("w", 1, {8}, Region{{4}, {4}, std::nullopt}),
  };
  auto plan = BuildSavePlan(pieces, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(plan.status().message(), HasSubstr("rank 0"));
  EXPECT_THAT(plan.status().message(), HasSubstr("rank 1"));
}

TEST(SavePlanTest, HolesAndDTypeMismatchesAreRejected) {
  auto hole = BuildSavePlan({Piece("w", 0, {8}, Region{{0}, {4}, std::nullopt})}, 1);
  ASSERT_FALSE(hole.ok());
  EXPECT_THAT(hole.status().message(), HasSubstr("'w'"));
  auto dtype = BuildSavePlan({Piece("w", 0, {8}, Region{{0}, {4}, std::nullopt}),
                              Piece("w", 1, {8}, Region{{4}, {4}, std::nullopt}, {}, DType::kBF16)},
                             2);
  ASSERT_FALSE(dtype.ok());
  EXPECT_THAT(dtype.status().message(), HasSubstr("'w'"));
}

TEST(SavePlanTest, SameIdWithDifferentRegionsIsRejected) {
  std::vector<TensorPiece> pieces = {
      Piece("w", 0, {8}, Region{{0}, {8}, std::nullopt}),
      Piece("w", 1, {8}, Region{{0}, {4}, std::nullopt}, {1}),
  };
  auto plan = BuildSavePlan(pieces, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("differ in region"));
}

TEST(SavePlanTest, RankOutsideTheJobIsRejected) {
  auto plan = BuildSavePlan({Piece("w", 3, {8}, Region{{0}, {8}, std::nullopt})}, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("outside [0, 2)"));
}

TEST(SavePlanTest, SameMetadataGivesTheSamePlan) {
  const auto pieces = MegatronLikeLayout();
  auto a = BuildSavePlan(pieces, 4);
  auto b = BuildSavePlan(pieces, 4);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->writers.size(), b->writers.size());
  for (size_t w = 0; w < a->writers.size(); ++w) {
    ASSERT_EQ(a->writers[w].files.size(), b->writers[w].files.size());
    for (size_t f = 0; f < a->writers[w].files.size(); ++f) {
      ASSERT_EQ(a->writers[w].files[f].pieces.size(), b->writers[w].files[f].pieces.size());
      for (size_t p = 0; p < a->writers[w].files[f].pieces.size(); ++p) {
        EXPECT_EQ(a->writers[w].files[f].pieces[p].source_index,
                  b->writers[w].files[f].pieces[p].source_index);
      }
    }
  }
}

// A random TP x DP layout over `*num_ranks` ranks: each tensor split on a random dim over TP
// (uneven, possibly empty pieces), replicated over DP with the main replica on a random DP
// rank, or flat-sharded over all ranks.
std::vector<TensorPiece> RandomLayout(std::mt19937_64& rng, int64_t* num_ranks) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t tp = pick(1, 4), dp = pick(1, 3), n = tp * dp;
  *num_ranks = n;
  std::vector<TensorPiece> pieces;
  for (int t = 0, k = static_cast<int>(pick(1, 6)); t < k; ++t) {
    const std::string key = "t" + std::to_string(t);
    std::vector<int64_t> shape = {pick(1, 7), pick(1, 5)};
    if (pick(0, 3) == 0) {  // flat-sharded over all ranks
      std::vector<int64_t> cuts = {0, shape[0] * shape[1]};
      for (int64_t r = 1; r < n; ++r) cuts.push_back(pick(0, shape[0] * shape[1]));
      std::sort(cuts.begin(), cuts.end());
      for (int64_t r = 0; r < n; ++r) {
        pieces.push_back(
            Piece(key, r, shape, Region{{0, 0}, shape, FlatRange{cuts[r], cuts[r + 1]}}));
      }
      continue;
    }
    const int dim = static_cast<int>(pick(0, 1));
    const int64_t chunk = (shape[dim] + tp - 1) / tp;  // torch.chunk
    const int64_t main_dp = pick(0, dp - 1);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t_rank = r % tp, d_rank = r / tp;
      const int64_t lo = std::min(shape[dim], t_rank * chunk);
      const int64_t hi = std::min(shape[dim], lo + chunk);
      Region region{{0, 0}, shape, {}};
      region.offsets[dim] = lo;
      region.lengths[dim] = hi - lo;
      if (hi == lo) continue;  // empty pieces are not reported
      pieces.push_back(Piece(key, r, shape, region, {0, d_rank == main_dp ? 0 : d_rank + 1}));
    }
  }
  return pieces;
}

// (writer, file path, source piece) of every planned piece, in plan order.
std::vector<std::tuple<int64_t, std::string, int64_t>> Placements(const SavePlan& plan) {
  std::vector<std::tuple<int64_t, std::string, int64_t>> out;
  for (const WriterPlan& w : plan.writers) {
    for (const PlannedFile& f : w.files) {
      for (const PlannedPiece& p : f.pieces) out.emplace_back(w.rank, f.path, p.source_index);
    }
  }
  return out;
}

// The plan without groups is computed from chains of pieces by id; one group of every rank
// goes through Megatron's DetermineMainReplicaDistribution (checked against megatron-core by
// //tests:megatron_oracle_test). Both must place every piece alike, whatever the input order.
TEST(SavePlanPropertyTest, WithoutGroupsPlansAsOneGroupOfEveryRank) {
  std::mt19937_64 rng(23);
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    int64_t n = 0;
    std::vector<TensorPiece> pieces = RandomLayout(rng, &n);
    std::shuffle(pieces.begin(), pieces.end(), rng);
    SavePlanOptions options;
    options.target_file_bytes = std::uniform_int_distribution<int64_t>(1, 200)(rng);
    auto plain = BuildSavePlan(pieces, n, options);
    std::vector<int64_t> everyone;
    for (int64_t r = 0; r < n; ++r) everyone.push_back(r);
    options.groups = {everyone};
    auto grouped = BuildSavePlan(pieces, n, options);
    ASSERT_TRUE(plain.ok() && grouped.ok()) << plain.status() << " / " << grouped.status();
    EXPECT_EQ(Placements(*plain), Placements(*grouped));
    ExpectPlanWritesEveryElementOnce(pieces, *plain);
  }
}

// Random layouts (RandomLayout) with random file targets.
TEST(SavePlanPropertyTest, RandomLayoutsWriteEveryElementOnce) {
  std::mt19937_64 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 60; ++iter) {
    int64_t n = 0;
    std::vector<TensorPiece> pieces = RandomLayout(rng, &n);
    SavePlanOptions options;
    options.target_file_bytes = pick(1, 200);
    auto plan = BuildSavePlan(pieces, n, options);
    ASSERT_TRUE(plan.ok()) << "iteration " << iter << ": " << plan.status();
    SCOPED_TRACE("iteration " + std::to_string(iter));
    ExpectPlanWritesEveryElementOnce(pieces, *plan);
    for (const WriterPlan& w : plan->writers) {
      const int64_t expected_files =
          std::max<int64_t>(1, w.total_bytes / options.target_file_bytes);
      int64_t num_pieces = 0;  // non-empty ones
      for (const PlannedFile& f : w.files) {
        for (const PlannedPiece& p : f.pieces) num_pieces += p.size_bytes > 0;
      }
      EXPECT_EQ(static_cast<int64_t>(w.files.size()),
                std::min(expected_files, std::max<int64_t>(1, num_pieces)));
    }
  }
}

}  // namespace
}  // namespace ckpt
