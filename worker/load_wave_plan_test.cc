#include "worker/load_wave_plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"

namespace ckpt::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Region Rows(int64_t first, int64_t count) { return Region{{first, 0}, {count, 2}, std::nullopt}; }

// A float tensor "w" of shape [4, 2] stored as two pieces of two rows each.
pb::Manifest TwoPieceManifest() {
  pb::Manifest m;
  pb::TensorMeta* t = m.add_tensors();
  t->set_key("w");
  t->set_dtype(pb::DTYPE_F32);
  t->add_global_shape(4);
  t->add_global_shape(2);
  for (int p = 0; p < 2; ++p) {
    pb::StoredPiece* piece = m.add_pieces();
    piece->set_key("w");
    *piece->mutable_region() = RegionToProto(Rows(2 * p, 2));
    piece->set_file("data/r" + std::to_string(p) + "_0.safetensors");
  }
  return m;
}

TensorLookup Lookup(const pb::Manifest& m) {
  return [&m](const std::string& key) -> const pb::TensorMeta* {
    for (const pb::TensorMeta& t : m.tensors()) {
      if (t.key() == key) return &t;
    }
    return nullptr;
  };
}

LoadRequest Request(int rank, Region region) {
  LoadRequest q;
  q.rank = rank;
  q.key = "w";
  q.region = std::move(region);
  q.shape = {4, 2};
  q.dtype = DType::kF32;
  return q;
}

void AddUnit(pb::LoadWaveEntry* wave, int piece, int reader) {
  pb::LoadUnitEntry* u = wave->add_units();
  u->set_piece(piece);
  u->set_reader(reader);
  u->set_first_element(0);
  u->set_num_elements(4);
}

void AddDelivery(pb::LoadWaveEntry* wave, int unit, int request, int dst) {
  pb::LoadDeliveryEntry* d = wave->add_deliveries();
  d->set_unit(unit);
  d->set_request(request);
  d->set_dst_rank(dst);
}

TEST(LoadWavePlanTest, UnitsBecomeTheDistributionAndDeliveriesWhatEachRankNeeds) {
  const pb::Manifest m = TwoPieceManifest();
  const std::vector<LoadRequest> requests = {Request(0, Rows(0, 4)), Request(1, Rows(2, 2))};
  pb::LoadWaveEntry wave;
  AddUnit(&wave, 0, 0);
  AddUnit(&wave, 1, 1);
  AddDelivery(&wave, 0, 0, 0);
  AddDelivery(&wave, 1, 0, 0);
  AddDelivery(&wave, 1, 1, 1);
  auto built = BuildWaveExchange(wave, m, Lookup(m), requests, /*me=*/0, /*world=*/2,
                                 /*narrow=*/false, "wave 1");
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_EQ(built->plan.distribution.size(), 2u);
  EXPECT_EQ(built->plan.distribution[0].main_rank, 0);
  EXPECT_EQ(built->plan.distribution[1].main_rank, 1);
  // Rank 0 reads piece 0 (4 floats) only; it needs both pieces, rank 1 the second.
  ASSERT_EQ(built->reads.size(), 1u);
  EXPECT_EQ(built->reads[0].piece, 0);
  EXPECT_EQ(built->reads[0].end - built->reads[0].begin, 16);
  EXPECT_EQ(built->plan.needs[0].size(), 2u);
  ASSERT_EQ(built->plan.needs[1].size(), 1u);
  EXPECT_EQ(built->plan.needs[1][0].region, Rows(2, 2));
  EXPECT_THAT(built->my_targets, ElementsAre(ElementsAre(0), ElementsAre(0)));
}

TEST(LoadWavePlanTest, NarrowExchangeSendsOnlyTheRowsARequestCovers) {
  const pb::Manifest m = TwoPieceManifest();
  const std::vector<LoadRequest> requests = {Request(0, Rows(0, 2)), Request(1, Rows(3, 1))};
  pb::LoadWaveEntry wave;
  AddUnit(&wave, 0, 0);
  AddUnit(&wave, 1, 0);
  AddDelivery(&wave, 0, 0, 0);
  AddDelivery(&wave, 1, 1, 1);
  auto narrow = BuildWaveExchange(wave, m, Lookup(m), requests, 1, 2, /*narrow=*/true, "w");
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  ASSERT_EQ(narrow->plan.needs[1].size(), 1u);
  EXPECT_EQ(narrow->plan.needs[1][0].region, Rows(3, 1));
  auto whole = BuildWaveExchange(wave, m, Lookup(m), requests, 1, 2, /*narrow=*/false, "w");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->plan.needs[1][0].region, Rows(2, 2));
}

TEST(LoadWavePlanTest, WithoutNarrowTheReaderOfAUnitOnlyAnotherRankNeedsAlsoNeedsIt) {
  const pb::Manifest m = TwoPieceManifest();
  const std::vector<LoadRequest> requests = {Request(0, Rows(0, 2)), Request(1, Rows(2, 2))};
  pb::LoadWaveEntry wave;
  AddUnit(&wave, 0, 0);
  AddUnit(&wave, 1, 0);  // read by rank 0, delivered to rank 1 only
  AddDelivery(&wave, 0, 0, 0);
  AddDelivery(&wave, 1, 1, 1);
  auto whole = BuildWaveExchange(wave, m, Lookup(m), requests, 0, 2, /*narrow=*/false, "w");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->plan.needs[0].size(), 2u);
  EXPECT_EQ(whole->plan.needs[0][1].region, Rows(2, 2));
  // Nothing of it is scattered into rank 0's tensors.
  EXPECT_THAT(whole->my_targets, ElementsAre(ElementsAre(0), ElementsAre()));
  auto narrow = BuildWaveExchange(wave, m, Lookup(m), requests, 0, 2, /*narrow=*/true, "w");
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(narrow->plan.needs[0].size(), 1u);
}

TEST(LoadWavePlanTest, ADeliveryToTheWrongRankIsRefusedNamingTheWave) {
  const pb::Manifest m = TwoPieceManifest();
  const std::vector<LoadRequest> requests = {Request(0, Rows(0, 4))};
  pb::LoadWaveEntry wave;
  AddUnit(&wave, 0, 0);
  AddDelivery(&wave, 0, 0, /*dst=*/1);  // request 0 belongs to rank 0
  auto built = BuildWaveExchange(wave, m, Lookup(m), requests, 0, 2, false, "wave 3 of 5");
  ASSERT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(built.status().message(), HasSubstr("wave 3 of 5"));
}

TEST(LoadWavePlanTest, AUnitOfAPieceTheManifestLacksIsRefused) {
  const pb::Manifest m = TwoPieceManifest();
  pb::LoadWaveEntry wave;
  AddUnit(&wave, 7, 0);
  auto built = BuildWaveExchange(wave, m, Lookup(m), {}, 0, 2, false, "w");
  ASSERT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(built.status().message(), HasSubstr("piece 7"));
}

TEST(LoadWavePlanTest, DeliveriesThatLeaveAHoleInARequestAreRefusedBeforeAnythingMoves) {
  const pb::Manifest m = TwoPieceManifest();
  const std::vector<LoadRequest> requests = {Request(0, Rows(0, 4))};
  pb::LoadPlanPart part;
  pb::LoadWaveEntry* wave = part.add_waves();
  AddUnit(wave, 0, 0);
  AddUnit(wave, 1, 0);
  AddDelivery(wave, 0, 0, 0);
  absl::Status hole = CheckDeliveriesTileRequests(part, m, requests, 0, "rank 0 of job j");
  EXPECT_EQ(hole.code(), absl::StatusCode::kNotFound) << hole;
  EXPECT_THAT(hole.message(),
              HasSubstr("rank 0 of job j: the load plan: elements [4, 8) of tensor w"));
  AddDelivery(wave, 1, 0, 0);
  EXPECT_TRUE(CheckDeliveriesTileRequests(part, m, requests, 0, "r").ok());
  AddDelivery(wave, 1, 0, 0);  // the second piece twice
  EXPECT_FALSE(CheckDeliveriesTileRequests(part, m, requests, 0, "r").ok());
}

TEST(LoadWavePlanTest, ARequestForATensorTheCheckpointLacksIsRefusedNamingRankAndKey) {
  const pb::Manifest m = TwoPieceManifest();
  pb::LoadPlanPart part;
  part.set_world_size(2);
  part.set_path("/ckpt/a");
  pb::LoadRequestEntry* e = part.add_requests();
  e->set_rank(1);
  e->set_key("v");
  *e->mutable_region() = RegionToProto(Rows(0, 1));
  auto resolved = ResolveRequests(part, Lookup(m), "rank 1 of job j");
  ASSERT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resolved.status().message(), HasSubstr("rank 1 for v"));
  e->set_key("w");
  resolved = ResolveRequests(part, Lookup(m), "r");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)[0].shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ((*resolved)[0].dtype, DType::kF32);
}

}  // namespace
}  // namespace ckpt::worker
