#include "planner/load_plan.h"

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/test_util.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

using testing::HeldGlobalIndices;

// Element g of tensor t, as 8 bytes; a dtype of size s keeps the low s bytes.
uint64_t Value(int64_t t, int64_t g) {
  return (static_cast<uint64_t>(t) << 40) ^ (g * 2654435761u);
}

struct Scenario {
  std::vector<TensorMeta> tensors;
  std::vector<StoredPieceInfo> pieces;
  std::vector<LoadRequest> requests;
  std::map<std::string, std::string> files;  // file name -> bytes
  int64_t num_ranks = 1;
};

// Appends `piece` of tensor t to `file`, filling its bytes with the tensor's values.
void Store(Scenario& s, int64_t t, Region region, const std::string& file) {
  const TensorMeta& tensor = s.tensors[t];
  const int64_t elem = DTypeSize(tensor.dtype);
  std::string& bytes = s.files[file];
  StoredPieceInfo p{tensor.key, region, file, static_cast<int64_t>(bytes.size()), 0};
  for (int64_t g : HeldGlobalIndices(region, tensor.global_shape)) {
    const uint64_t v = Value(t, g);
    bytes.append(reinterpret_cast<const char*>(&v), elem);
  }
  p.byte_length = static_cast<int64_t>(bytes.size()) - p.byte_offset;
  s.pieces.push_back(std::move(p));
}

// Executes the plan in memory and checks: reads stay inside their pieces, deliveries come
// from the unit's reader, every requested element arrives exactly once with its value, and no
// rank exceeds the budget in any wave.
void Execute(const Scenario& s, const LoadPlan& plan, int64_t budget) {
  std::map<std::string, int64_t> tensor_index;
  for (size_t t = 0; t < s.tensors.size(); ++t) tensor_index[s.tensors[t].key] = t;
  std::vector<std::string> dest(s.requests.size());
  std::vector<std::vector<int>> arrivals(s.requests.size());
  for (size_t j = 0; j < s.requests.size(); ++j) {
    const auto& tensor = s.tensors[tensor_index[s.requests[j].key]];
    dest[j].assign(s.requests[j].region.NumElements() * DTypeSize(tensor.dtype), '\0');
    arrivals[j].assign(s.requests[j].region.NumElements(), 0);
  }
  for (const LoadWave& wave : plan.waves) {
    int64_t peak = 0;
    for (int64_t r = 0; r < plan.num_ranks; ++r) {
      const int64_t flight = WaveBytesInFlight(wave, plan.algorithm, r);
      EXPECT_LE(flight, budget) << "rank " << r;
      peak = std::max(peak, flight);
    }
    EXPECT_EQ(wave.peak_bytes_in_flight, peak);
    std::vector<std::string> buffers;
    for (const ReadUnit& u : wave.units) {
      const StoredPieceInfo& p = s.pieces[u.piece];
      EXPECT_EQ(u.file, p.file);
      EXPECT_GE(u.file_offset, p.byte_offset);
      EXPECT_LE(u.file_offset + u.byte_length, p.byte_offset + p.byte_length);
      EXPECT_EQ(u.byte_length, u.num_elements * u.elem_size);
      buffers.push_back(s.files.at(u.file).substr(u.file_offset, u.byte_length));
    }
    for (const Delivery& d : wave.deliveries) {
      const ReadUnit& u = wave.units[d.unit];
      EXPECT_EQ(d.src_rank, u.reader);
      EXPECT_EQ(d.dst_rank, s.requests[d.request].rank);
      int64_t elements = 0;
      for (const CopyRun& run : d.runs) {
        ASSERT_GE(run.src_offset, 0);
        ASSERT_LE(run.src_offset + run.length, u.num_elements);
        ASSERT_LE(run.dst_offset + run.length, static_cast<int64_t>(arrivals[d.request].size()));
        for (int64_t k = 0; k < run.length; ++k) ++arrivals[d.request][run.dst_offset + k];
        elements += run.length;
      }
      EXPECT_EQ(elements, d.elements);
      CopyRuns(d.runs, u.elem_size, buffers[d.unit].data(), dest[d.request].data());
    }
  }
  for (size_t j = 0; j < s.requests.size(); ++j) {
    const int64_t t = tensor_index[s.requests[j].key];
    const int64_t elem = DTypeSize(s.tensors[t].dtype);
    const auto indices = HeldGlobalIndices(s.requests[j].region, s.tensors[t].global_shape);
    for (size_t k = 0; k < indices.size(); ++k) {
      ASSERT_EQ(arrivals[j][k], 1) << "request " << j << " element " << k;
      const uint64_t v = Value(t, indices[k]);
      ASSERT_EQ(std::memcmp(dest[j].data() + k * elem, &v, elem), 0)
          << "request " << j << " element " << k;
    }
  }
}

// Cut points splitting [0, n) into up to `parts` ranges (some possibly empty).
std::vector<int64_t> Cuts(std::mt19937_64& rng, int64_t n, int parts) {
  std::vector<int64_t> cuts = {0, n};
  for (int i = 1; i < parts; ++i) cuts.push_back(std::uniform_int_distribution<int64_t>(0, n)(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// A random 2-d tensor saved as a grid (some boxes further split into flat ranges) and loaded
// on a different grid, with replicated and flat-range requests.
Scenario RandomScenario(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Scenario s;
  s.num_ranks = pick(1, 6);
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16};
  for (int t = 0; t < 2; ++t) {
    s.tensors.push_back(
        TensorMeta{"t" + std::to_string(t), dtypes[pick(0, 2)], {pick(1, 9), pick(1, 12)}});
    const auto& shape = s.tensors[t].global_shape;
    const auto rows = Cuts(rng, shape[0], 3), cols = Cuts(rng, shape[1], 3);
    for (size_t a = 0; a + 1 < rows.size(); ++a) {
      for (size_t b = 0; b + 1 < cols.size(); ++b) {
        Region box{{rows[a], cols[b]}, {rows[a + 1] - rows[a], cols[b + 1] - cols[b]}, {}};
        const std::string file = "f" + std::to_string(pick(0, 2));
        if (box.BoxElements() > 1 && pick(0, 2) == 0) {  // stored as two flat ranges
          const int64_t mid = pick(0, box.BoxElements());
          Region first = box, second = box;
          first.flat = FlatRange{0, mid};
          second.flat = FlatRange{mid, box.BoxElements()};
          Store(s, t, first, file);
          Store(s, t, second, "f3");
        } else {
          Store(s, t, box, file);
        }
      }
    }
    // Requests: a grid over the ranks, each cell asked for by 1-2 ranks, plus a flat range.
    const auto rrows = Cuts(rng, shape[0], 2), rcols = Cuts(rng, shape[1], 3);
    for (size_t a = 0; a + 1 < rrows.size(); ++a) {
      for (size_t b = 0; b + 1 < rcols.size(); ++b) {
        Region box{{rrows[a], rcols[b]}, {rrows[a + 1] - rrows[a], rcols[b + 1] - rcols[b]}, {}};
        const int copies = static_cast<int>(pick(1, 2));
        for (int c = 0; c < copies; ++c)
          s.requests.push_back({pick(0, s.num_ranks - 1), s.tensors[t].key, box});
      }
    }
    const int64_t total = shape[0] * shape[1];
    const int64_t start = pick(0, total);
    s.requests.push_back({pick(0, s.num_ranks - 1), s.tensors[t].key,
                          Region{{0, 0}, shape, FlatRange{start, pick(start, total)}}});
  }
  return s;
}

TEST(LoadPlanPropertyTest, EveryRequestedElementArrivesOnceWithinBudget) {
  std::mt19937_64 rng(99);
  const ExchangeAlgorithm algorithms[] = {
      ExchangeAlgorithm::kOverlapAllToAll, ExchangeAlgorithm::kBroadcast,
      ExchangeAlgorithm::kGatherRounds, ExchangeAlgorithm::kGatherObject};
  for (int iter = 0; iter < 150; ++iter) {
    Scenario s = RandomScenario(rng);
    LoadPlanOptions options;
    options.algorithm = algorithms[iter % 4];
    options.memory_budget_bytes = iter % 3 == 0 ? (int64_t{1} << 30) : 8 * (1 + iter % 11);
    options.split_disjoint_reads = iter % 5 != 0;
    auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
    ASSERT_TRUE(plan.ok()) << "iteration " << iter << ": " << plan.status();
    SCOPED_TRACE("iteration " + std::to_string(iter));
    Execute(s, *plan, options.memory_budget_bytes);
    if (HasFatalFailure()) return;
  }
}

// One tensor (4, 8) of F32 stored as one piece; rank 0 needs rows 1-2 only.
Scenario OnePieceScenario() {
  Scenario s;
  s.num_ranks = 2;
  s.tensors.push_back({"w", DType::kF32, {4, 8}});
  Store(s, 0, Region{{0, 0}, {4, 8}, {}}, "data/r0_0.safetensors");
  return s;
}

TEST(LoadPlanTest, ReadsOnlyTheSpanCoveringNeededElements) {
  Scenario s = OnePieceScenario();
  s.requests.push_back({0, "w", Region{{1, 2}, {2, 3}, {}}});
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves.size(), 1u);
  ASSERT_EQ(plan->waves[0].units.size(), 1u);
  const ReadUnit& u = plan->waves[0].units[0];
  EXPECT_EQ(u.reader, 0);
  EXPECT_EQ(u.first_element, 10);  // (1, 2)
  EXPECT_EQ(u.num_elements, 11);   // through (2, 4)
  EXPECT_EQ(u.file_offset, 40);
  EXPECT_EQ(u.byte_length, 44);
  EXPECT_FALSE(u.exchanged);
  Execute(s, *plan, LoadPlanOptions().memory_budget_bytes);
}

TEST(LoadPlanTest, RanksNeedingDisjointSpansReadTheirOwn) {
  // A TP=2 shard loaded as two TP=4 shards: rows 0-1 to rank 0, rows 2-3 to rank 1.
  Scenario s = OnePieceScenario();
  s.requests.push_back({0, "w", Region{{0, 0}, {2, 8}, {}}});
  s.requests.push_back({1, "w", Region{{2, 0}, {2, 8}, {}}});
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves.size(), 1u);
  ASSERT_EQ(plan->waves[0].units.size(), 2u);
  int64_t bytes = 0;
  for (const ReadUnit& u : plan->waves[0].units) {
    EXPECT_FALSE(u.exchanged);
    EXPECT_EQ(u.first_element, u.reader * 16);
    EXPECT_EQ(u.num_elements, 16);
    bytes += u.byte_length;
  }
  EXPECT_EQ(bytes, 128);  // the piece, once
  Execute(s, *plan, LoadPlanOptions().memory_budget_bytes);

  // Without splitting: one reader, half of the piece exchanged.
  LoadPlanOptions one_reader;
  one_reader.split_disjoint_reads = false;
  plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, one_reader);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves[0].units.size(), 1u);
  EXPECT_TRUE(plan->waves[0].units[0].exchanged);
  Execute(s, *plan, one_reader.memory_budget_bytes);
}

TEST(LoadPlanTest, RestrictedReadersReadPiecesTheyDoNotNeedAndDeliverToEveryone) {
  // Memory loads: only rank 2 (whose worker holds the file) may read the piece; ranks 0 and 1
  // need disjoint halves of it and receive them, whatever the algorithm.
  for (ExchangeAlgorithm algorithm :
       {ExchangeAlgorithm::kOverlapAllToAll, ExchangeAlgorithm::kBroadcast,
        ExchangeAlgorithm::kGatherRounds, ExchangeAlgorithm::kGatherObject}) {
    Scenario s = OnePieceScenario();
    s.num_ranks = 3;
    s.requests.push_back({0, "w", Region{{0, 0}, {2, 8}, {}}});
    s.requests.push_back({1, "w", Region{{2, 0}, {2, 8}, {}}});
    LoadPlanOptions options;
    options.algorithm = algorithm;
    options.readers_of_piece = {{2}};
    auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const LoadWave& wave : plan->waves) {
      for (const ReadUnit& u : wave.units) {
        EXPECT_EQ(u.reader, 2);
        EXPECT_TRUE(u.exchanged);
      }
    }
    Execute(s, *plan, options.memory_budget_bytes);
  }
}

TEST(LoadPlanTest, ANeededPieceNoRankMayReadIsRefusedNamingIt) {
  Scenario s = OnePieceScenario();
  s.requests.push_back({0, "w", Region{{0, 0}, {2, 8}, {}}});
  LoadPlanOptions options;
  options.readers_of_piece = {{}};
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("data/r0_0.safetensors"));
}

TEST(LoadPlanTest, RanksNeedingInterleavedOrSharedBytesShareOneRead) {
  // Columns 0-3 and 4-7: each rank's span crosses the other's, so one read is exchanged
  // rather than both ranks reading (nearly) the whole piece; the same for a replicated need.
  for (bool replicated : {false, true}) {
    Scenario s = OnePieceScenario();
    s.requests.push_back({0, "w", Region{{0, 0}, {4, replicated ? 8 : 4}, {}}});
    s.requests.push_back({1, "w", Region{{0, replicated ? 0 : 4}, {4, replicated ? 8 : 4}, {}}});
    auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->waves[0].units.size(), 1u);
    EXPECT_TRUE(plan->waves[0].units[0].exchanged);
    Execute(s, *plan, LoadPlanOptions().memory_budget_bytes);
  }
}

TEST(LoadPlanTest, PieceLargerThanBudgetIsSplitIntoWaves) {
  Scenario s = OnePieceScenario();
  s.requests.push_back({0, "w", Region{{0, 0}, {4, 8}, {}}});
  s.requests.push_back({1, "w", Region{{0, 0}, {4, 8}, {}}});
  for (ExchangeAlgorithm algorithm :
       {ExchangeAlgorithm::kOverlapAllToAll, ExchangeAlgorithm::kBroadcast}) {
    LoadPlanOptions options;
    options.algorithm = algorithm;
    options.memory_budget_bytes = 40;  // 10 elements; the piece is 128 bytes
    auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->waves.size(), 4u);  // 10 + 10 + 10 + 2 elements
    Execute(s, *plan, options.memory_budget_bytes);
  }
}

TEST(LoadPlanTest, ReadersAreSpreadOverNeedingRanks) {
  // Two replicated tensors needed by both ranks: each rank reads one.
  Scenario s;
  s.num_ranks = 2;
  s.tensors = {{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}};
  Store(s, 0, Region{{0}, {4}, {}}, "f");
  Store(s, 1, Region{{0}, {4}, {}}, "f");
  for (int64_t r = 0; r < 2; ++r) {
    s.requests.push_back({r, "a", Region{{0}, {4}, {}}});
    s.requests.push_back({r, "b", Region{{0}, {4}, {}}});
  }
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->reader_of_piece, (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}}));
  Execute(s, *plan, int64_t{1} << 30);
}

TEST(LoadPlanTest, GatherRoundsGroupExchangedUnitsByDtypeThenRound) {
  // Rank 0 reads two F32 pieces and rank 1 one BF16 piece and one F32 piece; all needed by
  // both ranks, so all are exchanged.
  Scenario s;
  s.num_ranks = 2;
  s.tensors = {{"a", DType::kF32, {8}},
               {"b", DType::kF32, {4}},
               {"c", DType::kBF16, {4}},
               {"d", DType::kF32, {2}}};
  for (int t = 0; t < 4; ++t) {
    Store(s, t, Region{{0}, s.tensors[t].global_shape, {}}, "f");
    for (int64_t r = 0; r < 2; ++r) {
      s.requests.push_back({r, s.tensors[t].key, Region{{0}, s.tensors[t].global_shape, {}}});
    }
  }
  LoadPlanOptions options;
  options.algorithm = ExchangeAlgorithm::kGatherRounds;
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves.size(), 1u);
  const LoadWave& wave = plan->waves[0];
  // Distribution: a (32 B) -> 0, b (16 B) -> 1, c (8 B) -> 1, d (8 B) -> 1.
  ASSERT_EQ(wave.rounds.size(), 3u);
  EXPECT_EQ(wave.rounds[0].dtype, DType::kBF16);  // "BF16" < "F32"
  ASSERT_EQ(wave.rounds[0].unit_of_rank.size(), 1u);
  EXPECT_EQ(wave.rounds[0].unit_of_rank[0].first, 1);
  EXPECT_EQ(wave.rounds[1].dtype, DType::kF32);
  ASSERT_EQ(wave.rounds[1].unit_of_rank.size(), 2u);  // a from rank 0, b from rank 1
  EXPECT_EQ(wave.units[wave.rounds[1].unit_of_rank[0].second].piece, 0);
  EXPECT_EQ(wave.units[wave.rounds[1].unit_of_rank[1].second].piece, 1);
  ASSERT_EQ(wave.rounds[2].unit_of_rank.size(), 1u);  // d from rank 1; rank 0 sends nothing
  EXPECT_EQ(wave.units[wave.rounds[2].unit_of_rank[0].second].piece, 3);
  Execute(s, *plan, options.memory_budget_bytes);
}

TEST(LoadPlanTest, ScalarsAndEmptyRegions) {
  Scenario s;
  s.num_ranks = 3;
  s.tensors = {{"step", DType::kI64, {}}, {"w", DType::kF32, {4}}};
  Store(s, 0, Region{{}, {}, {}}, "f");
  Store(s, 1, Region{{0}, {4}, FlatRange{0, 0}}, "f");  // an empty flat piece
  Store(s, 1, Region{{0}, {4}, FlatRange{0, 4}}, "f");
  for (int64_t r = 0; r < 3; ++r) s.requests.push_back({r, "step", Region{{}, {}, {}}});
  s.requests.push_back({2, "w", Region{{2}, {0}, {}}});  // nothing to fill
  s.requests.push_back({1, "w", Region{{0}, {4}, FlatRange{1, 3}}});
  for (ExchangeAlgorithm algorithm :
       {ExchangeAlgorithm::kOverlapAllToAll, ExchangeAlgorithm::kBroadcast}) {
    LoadPlanOptions options;
    options.algorithm = algorithm;
    auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->reader_of_piece.size(), 2u);  // the scalar and the non-empty flat piece
    Execute(s, *plan, options.memory_budget_bytes);
  }
}

TEST(LoadPlanTest, UncoveredRequestNamesTensorRankAndRegion) {
  Scenario s;
  s.num_ranks = 2;
  s.tensors = {{"w", DType::kF32, {8}}};
  Store(s, 0, Region{{0}, {4}, {}}, "f");
  s.requests.push_back({1, "w", Region{{2}, {4}, {}}});
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("tensor 'w': rank 1 request [2:6]"));
  EXPECT_THAT(plan.status().message(), HasSubstr("elements [2, 4) of it are stored in no piece"));
}

TEST(LoadPlanTest, OverlappingStoredPiecesAreRejected) {
  Scenario s;
  s.num_ranks = 1;
  s.tensors = {{"w", DType::kF32, {8}}};
  Store(s, 0, Region{{0}, {5}, {}}, "f");
  Store(s, 0, Region{{3}, {5}, {}}, "g");
  s.requests.push_back({0, "w", Region{{0}, {8}, {}}});
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("more than one piece (they overlap)"));
}

// Pieces [0, 4) and [2, 6) of an 8-element tensor: 8 elements in all, as many as the request
// wants, but [2, 4) twice and [6, 8) never. Coverage is checked exactly, not counted.
TEST(LoadPlanTest, AnOverlapHidingAHoleOfTheSameSizeIsRejected) {
  Scenario s;
  s.num_ranks = 1;
  s.tensors = {{"w", DType::kF32, {8}}};
  Store(s, 0, Region{{0}, {4}, {}}, "f");
  Store(s, 0, Region{{2}, {4}, {}}, "g");
  s.requests.push_back({0, "w", Region{{0}, {8}, {}}});
  auto plan = BuildLoadPlan(s.tensors, s.pieces, s.requests, s.num_ranks);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("tensor 'w': rank 0 request [0:8]"));
  EXPECT_THAT(plan.status().message(), HasSubstr("element 2 of it is stored by more than one"));
}

TEST(LoadPlanTest, BadInputsAreRejectedWithNames) {
  Scenario s = OnePieceScenario();
  s.requests.push_back({5, "w", Region{{0, 0}, {1, 1}, {}}});
  EXPECT_THAT(BuildLoadPlan(s.tensors, s.pieces, s.requests, 2).status().message(),
              HasSubstr("rank outside [0, 2)"));
  s.requests = {{0, "nope", Region{{0}, {1}, {}}}};
  EXPECT_THAT(BuildLoadPlan(s.tensors, s.pieces, s.requests, 2).status().message(),
              HasSubstr("tensor 'nope'"));
  s.requests = {{0, "w", Region{{0, 0}, {1, 1}, {}}}};
  s.pieces[0].byte_length -= 4;
  EXPECT_THAT(BuildLoadPlan(s.tensors, s.pieces, s.requests, 2).status().message(),
              HasSubstr("data/r0_0.safetensors"));
  s = OnePieceScenario();
  s.requests = {{0, "w", Region{{0, 0}, {1, 1}, {}}}};
  LoadPlanOptions tiny;
  tiny.memory_budget_bytes = 3;
  EXPECT_THAT(BuildLoadPlan(s.tensors, s.pieces, s.requests, 2, tiny).status().message(),
              HasSubstr("cannot hold one element"));
}

}  // namespace
}  // namespace ckpt
