#include "coordinator/layout_spec.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/overlap.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kMegatron[] = R"J({
  "world_size": 4,
  "mesh": {"tp": 2, "dp": 2},
  "rules": [
    {"match": "optimizer.*", "placements": ["Shard(0)", "Replicate()"], "flat": {
  "over" : "dp"
}
},
    {"regex": "layers\\.[0-9]+\\.qkv\\.weight", "placements": ["Shard(0)", "Replicate()"]},
    {"match": "layers.*.proj.weight", "placements": ["Shard(1)", "Replicate()"]},
    {"match": "*", "placements": ["Replicate()", "Replicate()"]}
  ]
})J";

TensorMeta Meta(std::string key, std::vector<int64_t> shape, DType dtype = DType::kBF16) {
  return TensorMeta{std::move(key), dtype, std::move(shape)};
}

TEST(GlobMatchTest, StarsQuestionMarksAndClasses) {
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("layers.*.qkv.weight", "layers.12.qkv.weight"));
  EXPECT_TRUE(GlobMatch("*.weight", "a.b.c.weight"));
  EXPECT_FALSE(GlobMatch("*.weight", "a.b.c.bias"));
  EXPECT_TRUE(GlobMatch("layer?", "layer7"));
  EXPECT_FALSE(GlobMatch("layer?", "layer77"));
  EXPECT_TRUE(GlobMatch("fc[12].w", "fc2.w"));
  EXPECT_FALSE(GlobMatch("fc[!12].w", "fc2.w"));
  EXPECT_TRUE(GlobMatch("fc[0-9]", "fc5"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXXbYYbc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXXbYYb"));
  EXPECT_TRUE(GlobMatch("x[", "x["));  // unclosed class is literal
}

TEST(ParsePlacementTest, DTensorSpellings) {
  EXPECT_EQ(ParsePlacement("Shard(0)"), Placement::Shard(0));
  EXPECT_EQ(ParsePlacement("Shard(dim=1)"), Placement::Shard(1));
  EXPECT_EQ(ParsePlacement(" Shard( -1 ) "), Placement::Shard(-1));
  EXPECT_EQ(ParsePlacement("Replicate()"), Placement::Replicate());
  EXPECT_FALSE(ParsePlacement("Shard()").has_value());
  EXPECT_FALSE(ParsePlacement("Partial()").has_value());
}

TEST(LayoutSpecTest, MeshKeepsWrittenOrder) {
  auto spec = LayoutSpec::Parse(
      R"J({"mesh": {"tp": 4, "dp": 2}, "rules": [{"match": "*", "placements": ["Shard(0)", "Replicate()"]}]
})J");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dim_names(), (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(spec->mesh().shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(spec->world_size(), 8);
}

TEST(LayoutSpecTest, ColumnParallelPiecesAndReplicaIds) {
  auto spec = LayoutSpec::Parse(kMegatron);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto pieces = spec->PiecesOf(Meta("layers.0.qkv.weight", {6, 4}));
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 4u);
  // rank = tp * 2 + dp
  EXPECT_EQ((*pieces)[0].region, (Region{{0, 0}, {3, 4}, std::nullopt}));
  EXPECT_EQ((*pieces)[1].region, (Region{{0, 0}, {3, 4}, std::nullopt}));
  EXPECT_EQ((*pieces)[2].region, (Region{{3, 0}, {3, 4}, std::nullopt}));
  EXPECT_EQ((*pieces)[0].replica_id, (std::vector<int64_t>{0}));
  EXPECT_EQ((*pieces)[1].replica_id, (std::vector<int64_t>{1}));
  EXPECT_EQ((*pieces)[3].replica_id, (std::vector<int64_t>{1}));
  EXPECT_EQ((*pieces)[3].rank, 3);
}

TEST(LayoutSpecTest, RowParallelShardsDimOne) {
  auto spec = LayoutSpec::Parse(kMegatron);
  ASSERT_TRUE(spec.ok());
  auto pieces = spec->PiecesOf(Meta("layers.3.proj.weight", {4, 6}));
  ASSERT_TRUE(pieces.ok());
  EXPECT_EQ((*pieces)[2].region, (Region{{0, 3}, {4, 3}, std::nullopt}));
}

TEST(LayoutSpecTest, FlatOptimizerStateSplitsTheTpBoxOverDp) {
  auto spec = LayoutSpec::Parse(kMegatron);
  ASSERT_TRUE(spec.ok());
  auto pieces = spec->PiecesOf(Meta("optimizer.exp_avg.layers.0.qkv.weight", {6, 5}, DType::kF32));
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  // Box [0:3, 0:5] (15 elements) split evenly over dp: chunk 8 -> [0,8), [8,15).
  EXPECT_EQ((*pieces)[0].region, (Region{{0, 0}, {3, 5}, FlatRange{0, 8}}));
  EXPECT_EQ((*pieces)[1].region, (Region{{0, 0}, {3, 5}, FlatRange{8, 15}}));
  EXPECT_EQ((*pieces)[3].region, (Region{{3, 0}, {3, 5}, FlatRange{8, 15}}));
  // The flat dim is not a replica dim: every piece is a main replica.
  for (const TensorPiece& p : *pieces) EXPECT_TRUE(p.is_main_replica()) << p.DebugString();
}

TEST(LayoutSpecTest, FlatOverMoreRanksThanElementsGivesEmptyRanges) {
  auto spec = LayoutSpec::Parse(
      R"J({"mesh": {"dp": 4}, "rules": [{"match": "*", "flat": {"over": "dp"}}]})J");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto pieces = spec->PiecesOf(Meta("b", {2}, DType::kF32));
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ((*pieces)[0].region.NumElements(), 1);
  EXPECT_EQ((*pieces)[1].region.NumElements(), 1);
  EXPECT_EQ((*pieces)[2].region.NumElements(), 0);
  EXPECT_EQ((*pieces)[3].region.NumElements(), 0);
  auto nonempty = spec->AllPieces({Meta("b", {2}, DType::kF32)}, /*drop_empty=*/true);
  ASSERT_TRUE(nonempty.ok());
  EXPECT_EQ(nonempty->size(), 2u);
}

TEST(LayoutSpecTest, FirstMatchingRuleWins) {
  auto spec = LayoutSpec::Parse(kMegatron);
  ASSERT_TRUE(spec.ok());
  auto rule = spec->RuleFor("optimizer.exp_avg.layers.0.qkv.weight");
  ASSERT_TRUE(rule.ok());
  EXPECT_EQ((*rule)->pattern, "optimizer.*");
  rule = spec->RuleFor("final_norm.weight");
  ASSERT_TRUE(rule.ok());
  EXPECT_EQ((*rule)->pattern, "*");
}

TEST(LayoutSpecTest, RegexIsAFullMatch) {
  auto spec = LayoutSpec::Parse(R"J({"mesh": {"tp": 2}, "rules": [
      {"regex": "a\\.[0-9]+", "placements": ["Shard(0)"]}]
})J");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->RuleFor("a.12").ok());
  EXPECT_FALSE(spec->RuleFor("a.12.b").ok());
  EXPECT_FALSE(spec->RuleFor("xa.1").ok());
}

TEST(LayoutSpecTest, TensorWithoutRuleIsNamed) {
  auto spec = LayoutSpec::Parse(
      R"J({"mesh": {"tp": 2}, "rules": [{"match": "*.weight", "placements": ["Shard(0)"]}]
})J");
  ASSERT_TRUE(spec.ok());
  auto pieces = spec->AllPieces({Meta("a.weight", {4}), Meta("a.bias", {4})});
  ASSERT_FALSE(pieces.ok());
  EXPECT_EQ(pieces.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pieces.status().message(), HasSubstr("\"a.bias\" matches no rule"));
}

TEST(LayoutSpecTest, PlacementThatDoesNotFitTheTensorNamesTensorAndRule) {
  auto spec = LayoutSpec::Parse(
      R"J({"mesh": {"tp": 2}, "rules": [{"match": "*", "placements": ["Shard(1)"]}]
})J");
  ASSERT_TRUE(spec.ok());
  auto pieces = spec->PiecesOf(Meta("norm.weight", {8}));
  ASSERT_FALSE(pieces.ok());
  EXPECT_THAT(pieces.status().message(), HasSubstr("norm.weight"));
  EXPECT_THAT(pieces.status().message(), HasSubstr("rule \"*\""));
}

struct BadLayout {
  const char* json;
  const char* expected;
};

TEST(LayoutSpecTest, ParseErrorsNameTheJsonPath) {
  const BadLayout cases[] = {
      {"{", "not valid JSON"},
      {"[]", "expected an object"},
      {R"J({"rules": []})J", "layout mesh: missing"},
      {R"J({"mesh": {"tp": 0}, "rules": []})J", "mesh.tp: expected an integer >= 1"},
      {R"J({"mesh": {"tp": "2"}, "rules": []})J", "mesh.tp"},
      {R"J({"mesh": {"tp": 2}, "world_size": 3, "rules": [{"match": "*", "placements": ["Shard(0)"]}]})J",
       "world_size: 3 does not equal"},
      {R"J({"mesh": {"tp": 2}, "rules": []})J", "rules: expected a non-empty array"},
      {R"J({"mesh": {"tp": 2}, "rulez": []})J", "rulez: unknown field"},
      {R"J({"mesh": {"tp": 2}, "rules": [{"placements": ["Shard(0)"]}]
})J",
       "rules[0]: needs exactly one of"},
      {R"J({"mesh": {"tp": 2, "dp": 2}, "rules": [
          {"match": "a", "placements": ["Shard(0)", "Replicate()"]},
          {"match": "b", "placements": ["Shard(0)", "Replicate()"]},
          {"match": "c", "placements": ["Shard(0)", "Shard(x)"]}]
})J",
       "rules[2].placements[1]: unknown placement \"Shard(x)\""},
      {R"J({"mesh": {"tp": 2, "dp": 2}, "rules": [{"match": "a", "placements": ["Shard(0)"]}]
})J",
       "rules[0].placements: expected an array of 2 placements"},
      {R"J({"mesh": {"tp": 2}, "rules": [{"match": "a", "flat": {"over": "dp"}}]})J",
       "rules[0].flat.over: \"dp\" is not a mesh dim"},
      {R"J({"mesh": {"tp": 2}, "rules": [{"match": "a", "flat": {"over": "tp"}, "placements": ["Shard(0)"]}]
})J",
       "rules[0].placements[0]: mesh dim \"tp\" carries the flat sharding"},
      {R"J({"mesh": {"tp": 2}, "rules": [{"regex": "(", "placements": ["Shard(0)"]}]
})J",
       "rules[0].regex: invalid regex"},
      {R"J({"mesh": {"tp": 2}, "rules": [{"match": "a"}]})J",
       "rules[0]: needs \"placements\" and/or \"flat\""},
      {R"J({"mesh": {"tp": 2}, "rules": [{"match": "a", "placement": []}]})J",
       "rules[0].placement: unknown field"},
  };
  for (const BadLayout& c : cases) {
    auto spec = LayoutSpec::Parse(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.expected)) << c.json;
  }
}

TEST(LayoutSpecTest, FromFileNamesMissingFile) {
  auto spec = LayoutSpec::FromFile("/nonexistent/layout.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/layout.json"));
}

TEST(LayoutSpecTest, SavedLayoutRecordsPlacementsAndFlat) {
  auto spec = LayoutSpec::Parse(kMegatron);
  ASSERT_TRUE(spec.ok());
  auto saved = spec->ToSavedLayout(
      {Meta("layers.0.proj.weight", {4, 4}), Meta("optimizer.m.x", {4}, DType::kF32)});
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->world_size(), 4);
  ASSERT_EQ(saved->tensors_size(), 2);
  EXPECT_EQ(saved->tensors(0).placements(0).shard_dim(), 1);
  EXPECT_TRUE(saved->tensors(0).placements(1).replicate());
  EXPECT_FALSE(saved->tensors(0).flat_sharded());
  EXPECT_TRUE(saved->tensors(1).flat_sharded());
}

// Property: for random meshes, placements (with and without a flat dim) and shapes, the main
// replicas cover every element exactly once, and each rank's replica id counts the ranks that
// hold the same data. Checked by brute force per element.
TEST(LayoutSpecTest, RandomLayoutsCoverEveryElementOnce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    const int mesh_dims = 1 + rng() % 3;
    std::string mesh = "{";
    for (int d = 0; d < mesh_dims; ++d) {
      absl::StrAppend(&mesh, d ? ", " : "", "\"m", d, "\": ", 1 + rng() % 3);
    }
    mesh += "}";
    const int ndim = 1 + rng() % 3;
    std::vector<int64_t> shape;
    for (int d = 0; d < ndim; ++d) shape.push_back(rng() % 6);
    const int flat = static_cast<int>(rng() % (mesh_dims + 1)) - 1;  // -1: none
    std::string placements;
    for (int d = 0; d < mesh_dims; ++d) {
      const bool shard = d != flat && rng() % 2;
      absl::StrAppend(
          &placements, d ? ", " : "",
          shard ? absl::StrCat("\"Shard(", rng() % ndim, ")\"") : std::string("\"Replicate()\""));
    }
    std::string json = absl::StrCat(
        R"J({"mesh": )J", mesh, R"J(, "rules": [{"match": "*", "placements": [)J", placements, "]",
        flat >= 0 ? absl::StrCat(R"J(, "flat": {"over": "m)J", flat, "\"}") : "", "}]}");
    auto spec = LayoutSpec::Parse(json);
    ASSERT_TRUE(spec.ok()) << json << ": " << spec.status();
    auto pieces = spec->PiecesOf(Meta("t", shape));
    ASSERT_TRUE(pieces.ok()) << json << ": " << pieces.status();
    auto numel = CheckedNumElements(shape);
    ASSERT_TRUE(numel.ok());
    std::vector<int> main_count(*numel, 0);
    const Region whole = WholeRegion(shape);
    for (const TensorPiece& p : *pieces) {
      ASSERT_TRUE(ValidateRegion(p.region, shape).ok()) << json << " " << p.DebugString();
      if (!p.is_main_replica()) continue;
      auto runs = OverlapRuns(p.region, whole, shape);
      ASSERT_TRUE(runs.ok());
      for (const CopyRun& r : *runs) {
        for (int64_t i = 0; i < r.length; ++i) ++main_count[r.dst_offset + i];
      }
    }
    for (int64_t i = 0; i < *numel; ++i) {
      ASSERT_EQ(main_count[i], 1) << json << " shape " << ShapeString(shape) << " element " << i;
    }
    ASSERT_TRUE(ValidateLayout(*pieces).ok()) << json;
  }
}

}  // namespace
}  // namespace ckpt
