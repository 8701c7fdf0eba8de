#include "tools/loadgen/gpt_pipeline_layout.h"

#include <map>
#include <set>

#include "gtest/gtest.h"
#include "proto/compact_convert.h"
#include "proto/convert.h"
#include "sharding/coverage.h"

namespace ckpt::loadgen {
namespace {

TEST(ParseParallelismTest, ReadsTpAndPpAndDerivesDp) {
  absl::StatusOr<Parallelism> p = ParseParallelism("tp8pp16", 2048);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tp, 8);
  EXPECT_EQ(p->pp, 16);
  EXPECT_EQ(p->dp, 16);
  p = ParseParallelism("pp4", 8);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tp, 1);
  EXPECT_EQ(p->dp, 2);
}

TEST(ParseParallelismTest, RefusesMalformedLayoutsAndRankCountsNamingThem) {
  for (const char* bad : {"", "tp", "tp0pp2", "pp2tp2", "tp8pp16x", "dp4"}) {
    absl::StatusOr<Parallelism> p = ParseParallelism(bad, 64);
    EXPECT_FALSE(p.ok()) << bad;
  }
  absl::StatusOr<Parallelism> p = ParseParallelism("tp8pp16", 1000);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("1000 ranks"), std::string::npos) << p.status();
}

// Every rank's shards, checked against the layout's meaning: each rank holds only its
// stage's tensors, and the main replicas (replica id all zeros) store each tensor exactly once.
TEST(GptPipelineLayoutTest, MainReplicasOfAllRanksStoreEveryTensorOnce) {
  GptConfig model;
  model.layers = 4;
  model.hidden = 16;
  model.vocab = 40;
  absl::StatusOr<Parallelism> p = ParseParallelism("tp2pp2", 12);  // dp 3
  ASSERT_TRUE(p.ok());
  absl::StatusOr<GptPipelineLayout> layout = GptPipelineLayout::Create(model, *p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::map<std::string, std::vector<Region>> stored;
  std::map<std::string, std::set<int64_t>> stages_of;
  for (int64_t r = 0; r < layout->world_size(); ++r) {
    absl::StatusOr<pb::RankState> state = layout->RankState(r);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->rank(), r);
    for (const pb::PieceMeta& s : state->shards()) {
      stages_of[s.tensor().key()].insert(layout->StageOf(r));
      bool main = true;
      for (int64_t id : s.replica_id()) main = main && id == 0;
      if (!main) continue;
      absl::StatusOr<Region> region = RegionFromProto(s.region());
      ASSERT_TRUE(region.ok());
      stored[s.tensor().key()].push_back(*region);
    }
  }
  ASSERT_EQ(stored.size(), layout->tensors().size());
  for (const TensorMeta& t : layout->tensors()) {
    EXPECT_TRUE(CheckExactCoverage(t.key, t.global_shape, stored[t.key]).ok()) << t.key;
    EXPECT_EQ(stages_of[t.key].size(), 1u) << t.key << " lives on more than one stage";
  }
  EXPECT_EQ(*stages_of["embedding.word_embeddings.weight"].begin(), 0);
  EXPECT_EQ(*stages_of["layers.1.mlp.fc1.weight"].begin(), 0);
  EXPECT_EQ(*stages_of["layers.2.mlp.fc1.weight"].begin(), 1);
  EXPECT_EQ(*stages_of["optimizer.exp_avg.output_layer.weight"].begin(), 1);
}

TEST(GptPipelineLayoutTest, RanksAreNumberedTpFastestThenDpThenPp) {
  GptConfig model;
  model.layers = 2;
  model.hidden = 16;
  model.vocab = 32;
  absl::StatusOr<GptPipelineLayout> layout = GptPipelineLayout::Create(model, {2, 2, 2});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->StageOf(3), 0);
  EXPECT_EQ(layout->StageOf(4), 1);
  // Rank 3 = tp 1, dp 1 of stage 0: the second half of qkv's rows, a DP replica (id 1).
  absl::StatusOr<pb::RankState> state = layout->RankState(3);
  ASSERT_TRUE(state.ok());
  bool found = false;
  for (const pb::PieceMeta& s : state->shards()) {
    if (s.tensor().key() != "layers.0.attention.qkv.weight") continue;
    found = true;
    EXPECT_EQ(s.region().offsets(0), 24);
    EXPECT_EQ(s.replica_id(0), 1);
  }
  EXPECT_TRUE(found);
}

TEST(GptPipelineLayoutTest, CompactRanksExpandToExactlyTheListedPiecesAndAreSmaller) {
  GptConfig model;
  model.layers = 4;
  model.hidden = 16;
  model.vocab = 40;
  absl::StatusOr<GptPipelineLayout> layout = GptPipelineLayout::Create(model, {2, 2, 3});
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (int64_t r = 0; r < layout->world_size(); ++r) {
    absl::StatusOr<pb::RankState> full = layout->RankState(r);
    absl::StatusOr<pb::RankState> compact = layout->RankState(r, /*compact=*/true);
    ASSERT_TRUE(full.ok() && compact.ok());
    // Every tensor, the flat-sharded optimizer state included, goes compact.
    EXPECT_EQ(compact->shards_size(), 0)
        << "rank " << r << ": " << (compact->shards_size() ? compact->shards(0).DebugString() : "");
    int described = 0;
    for (const pb::CompactTensors& run : compact->compact_tensors())
      described += run.tensors_size();
    EXPECT_EQ(described, full->shards_size());
    EXPECT_LE(compact->compact_tensors_size(), 6);  // one run per (placements, flat) in use
    EXPECT_EQ(compact->compact_meshes_size(), 1);
    EXPECT_LT(compact->ByteSizeLong(), full->ByteSizeLong());
    pb::RankState expanded;
    absl::StatusOr<const pb::RankState*> got =
        ExpandCompactTensors(*compact, &expanded, absl::StrCat("rank ", r));
    ASSERT_TRUE(got.ok()) << got.status();
    // Neither form has memory kinds or layouts.
    EXPECT_EQ(expanded.SerializeAsString(), full->SerializeAsString()) << "rank " << r;
  }
}

TEST(GptPipelineLayoutTest, RefusesLayersThatDoNotSplitOverStages) {
  GptConfig model;
  model.layers = 3;
  EXPECT_FALSE(GptPipelineLayout::Create(model, {1, 2, 1}).ok());
  EXPECT_FALSE(ModelByName("gpt-9t").ok());
  EXPECT_TRUE(ModelByName("gpt-175b").ok());
}

}  // namespace
}  // namespace ckpt::loadgen
