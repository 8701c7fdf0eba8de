#include "planner/layout_spec.h"

#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "re2/re2.h"
#include "sharding/flat_sharding.h"
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

// The RE2 translation of a glob, compiled as layouts compile it.
bool Re2GlobMatch(const std::string& glob, const std::string& text) {
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingLatin1);
  options.set_dot_nl(true);
  options.set_log_errors(false);
  RE2 re(internal::GlobToRe2Pattern(glob), options);
  EXPECT_TRUE(re.ok()) << glob << " -> " << internal::GlobToRe2Pattern(glob) << ": " << re.error();
  return RE2::FullMatch(text, re);
}

// Property: the linear-time RE2 translation matches exactly what the backtracking GlobMatch
// twin matches, on random globs over an alphabet heavy in glob syntax and random texts
// (bytes >= 0x80 and newlines included).
TEST(GlobMatchTest, Re2TranslationAgreesWithGlobMatch) {
  std::mt19937 rng(5);
  const std::string glob_chars = "ab.*?[]!^-\n\xe9\xff*";
  const std::string text_chars = "ab.[]!^-\n\xe9\xff";
  for (int iter = 0; iter < 30000; ++iter) {
    std::string glob, text;
    for (int n = rng() % 9; n > 0; --n) glob += glob_chars[rng() % glob_chars.size()];
    for (int n = rng() % 9; n > 0; --n) text += text_chars[rng() % text_chars.size()];
    ASSERT_EQ(Re2GlobMatch(glob, text), GlobMatch(glob, text))
        << "glob \"" << glob << "\" text \"" << text << "\"";
  }
  // Classes compare byte values: [\x01-\xff] holds every byte but NUL.
  EXPECT_TRUE(GlobMatch("[\x01-\xff]", "\xe9"));
  EXPECT_TRUE(Re2GlobMatch("[\x01-\xff]", "\xe9"));
  EXPECT_FALSE(Re2GlobMatch("[z-a]", "m"));  // an empty class matches nothing
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

// A one-rule layout over `world` ranks with `pattern_field` ("match"/"regex") = `pattern`.
std::string OneRule(const std::string& pattern_field, const std::string& pattern,
                    int64_t world = 1) {
  return absl::StrCat(R"J({"mesh": {"r": )J", world, R"J(}, "rules": [{")J", pattern_field,
                      R"J(": ")J", pattern, R"J(", "placements": ["Replicate()"]}]})J");
}

void ExpectRefused(const std::string& json, const std::string& expected) {
  absl::StatusOr<LayoutSpec> spec = LayoutSpec::Parse(json);
  ASSERT_FALSE(spec.ok()) << json.substr(0, 200);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_THAT(message, HasSubstr(expected)) << json.substr(0, 200);
  EXPECT_LT(message.size(), 1000u) << "errors never echo a huge input";
}

// Issue 11 finding 3: each of these crashed (stack overflow) or hung the coordinator and
// offline ckptctl.
TEST(LayoutSpecHostileTest, DeepNestingIsRefusedWithTheLimitAndThePath) {
  const std::string brackets = std::string(200000, '[') + std::string(200000, ']');
  ExpectRefused(brackets, "layout [0][0][0]");
  ExpectRefused(brackets, "[0]: nested deeper than the limit of 16 levels");
  // Nested where a number belongs: the old error path dumped the value recursively.
  ExpectRefused(absl::StrCat(R"J({"mesh": {"r": )J", brackets, R"J(}, "rules": []})J"),
                "layout mesh.r[0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested deeper than the "
                "limit of 16 levels");
  ExpectRefused(absl::StrCat(R"J({"mesh": {"r": 1}, "rules": [{"comment": )J", brackets, "}]}"),
                "layout rules[0].comment[0]");
  // Within the limit, a nested value where a number belongs is named by its type only.
  ExpectRefused(R"J({"mesh": {"r": [[[[1]]]]}, "rules": []})J",
                "layout mesh.r: expected an integer >= 1, got array");
}

TEST(LayoutSpecHostileTest, RegexesAreRe2AndBounded) {
  // 100,000 nested parentheses: std::regex recursed until the stack overflowed.
  const std::string parens = std::string(100000, '(') + "a" + std::string(100000, ')');
  ExpectRefused(OneRule("regex", parens),
                "layout rules[0].regex: a string of 200001 bytes, more than the limit of 65536");
  ExpectRefused(OneRule("regex", std::string(1000, '(') + "a" + std::string(1000, ')')),
                "layout rules[0].regex: pattern of 2001 bytes, more than the limit of 1024");
  // RE2 has no recursion to overflow: 500 nested groups within the length limit compile.
  auto nested =
      LayoutSpec::Parse(OneRule("regex", std::string(500, '(') + "a" + std::string(500, ')')));
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_TRUE(nested->rules()[0].Matches("a"));
  // What RE2 does not support is a clear error naming the rule.
  ExpectRefused(OneRule("regex", "(?=a)a"), "layout rules[0].regex: invalid regex \"(?=a)a\"");
  ExpectRefused(OneRule("regex", "(a)\\\\1"), "layout rules[0].regex: invalid regex");
  ExpectRefused(OneRule("regex", "a{1000}{1000}"), "bad repetition operator");
  ExpectRefused(OneRule("regex", "\\\\pL{1000}"),
                "layout rules[0].regex: invalid regex \"\\\\pL{1000}\": pattern too large");
  ExpectRefused(OneRule("match", std::string(1025, '*')),
                "layout rules[0].match: pattern of 1025 bytes, more than the limit of 1024");
}

TEST(LayoutSpecHostileTest, CatastrophicPatternsMatchLongKeysInLinearTime) {
  // (.*.*)*X pinned a core forever under std::regex; .* against a 100,000-character key
  // overflowed its stack.
  const std::string key(100000, 'a');
  auto evil = LayoutSpec::Parse(R"J({"mesh": {"r": 2}, "rules": [
      {"regex": "(.*.*)*X", "placements": ["Shard(0)"]},
      {"regex": ".*", "placements": ["Replicate()"]}]})J");
  ASSERT_TRUE(evil.ok()) << evil.status();
  EXPECT_FALSE(evil->rules()[0].Matches(key));
  EXPECT_TRUE(evil->rules()[0].Matches(key + "X"));
  EXPECT_TRUE(evil->rules()[1].Matches(key));
  auto pieces = evil->PiecesOf(Meta(key, {4}));
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ((*pieces)[1].region, (Region{{0}, {4}, std::nullopt}));  // the second rule's
}

// Issue 11 finding 4: world sizes of 10^6 to 2^31 aborted with std::bad_alloc.
TEST(LayoutSpecHostileTest, WorldSizesAreBoundedBeforeAnythingPerRankExists) {
  ExpectRefused(
      R"J({"mesh": {"r": 2147483648}, "rules": [{"match": "*", "flat": {"over": "r"}}]})J",
      "layout mesh.r: 2147483648 is more than the limit of 1048576");
  ExpectRefused(
      R"J({"mesh": {"r": 18446744073709551615}, "rules": [{"match": "*", "flat": {"over": "r"}}]})J",
      "layout mesh.r: 18446744073709551615 is more than the limit of 1048576");
  // Each dim within the limit, the product not (nor within int64).
  ExpectRefused(
      R"J({"mesh": {"a": 1048576, "b": 1048576, "c": 1048576, "d": 1048576}, "rules": [{"match": "*", "flat": {"over": "a"}}]})J",
      "layout mesh: device mesh (1048576, 1048576, 1048576, 1048576) has more than the "
      "limit of 1048576 ranks");
  ExpectRefused(
      R"J({"world_size": 4294967296, "mesh": {"r": 2}, "rules": [{"match": "*", "flat": {"over": "r"}}]})J",
      "layout world_size: 4294967296 is more than the limit of 1048576");
  ExpectRefused(R"J({"mesh": {"r": 2.0}, "rules": []})J",
                "layout mesh.r: expected an integer >= 1, got 2.0");
  ExpectRefused(R"J({"mesh": {"r": -3}, "rules": []})J",
                "layout mesh.r: expected an integer >= 1, got -3");
  // The largest world is accepted; expanding it for more tensors than the piece limit allows
  // is an error before any piece is built.
  auto max = LayoutSpec::Parse(
      R"J({"mesh": {"r": 1048576}, "rules": [{"match": "*", "flat": {"over": "r"}}]})J");
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->world_size(), 1048576);
  std::vector<TensorMeta> tensors(17, Meta("t", {8}));
  auto all = max->AllPieces(tensors);
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(),
              HasSubstr("1048576 ranks times 17 tensors make 17825792 pieces, more than the "
                        "limit of 16777216"));
  auto mine = max->RankPieces(tensors, 1048575);  // one rank's pieces stay cheap
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)[0].region.flat, (FlatRange{8, 8}));
}

TEST(LayoutSpecHostileTest, RepeatedKeysAndOversizedPartsAreErrors) {
  // A repeated mesh dim silently won (the last size, the first position).
  ExpectRefused(
      R"J({"mesh": {"r": 2, "r": 4}, "rules": [{"match": "*", "placements": ["Shard(0)"]}]})J",
      "layout mesh: key \"r\" appears twice in this object");
  ExpectRefused(
      R"J({"mesh": {"r": 2}, "rules": [{"match": "a", "match": "*", "placements": ["Shard(0)"]}]})J",
      "layout rules[0]: key \"match\" appears twice in this object");
  ExpectRefused(R"J({"mesh": {"r": 2}, "mesh": {"r": 4}, "rules": []})J",
                "layout (document): key \"mesh\" appears twice in this object");
  std::string mesh = "{";
  for (int d = 0; d < 17; ++d) absl::StrAppend(&mesh, d ? ", " : "", "\"m", d, "\": 1");
  ExpectRefused(absl::StrCat(R"J({"mesh": )J", mesh, R"J(}, "rules": []})J"),
                "layout mesh: 17 dims, more than the limit of 16");
  ExpectRefused(absl::StrCat(R"J({"mesh": {")J", std::string(65, 'd'), R"J(": 1}, "rules": []})J"),
                "bytes, more than the limit of 64");
  std::string rules;
  for (int r = 0; r < 257; ++r) {
    absl::StrAppend(&rules, r ? ", " : "", R"J({"match": "*", "placements": ["Replicate()"]})J");
  }
  ExpectRefused(absl::StrCat(R"J({"mesh": {"r": 1}, "rules": [)J", rules, "]}"),
                "layout rules: 257 rules, more than the limit of 256");
  ExpectRefused(absl::StrCat(R"J({"mesh": {"r": 1}, "comment": ")J", std::string(1 << 20, 'c'),
                             R"J(", "rules": []})J"),
                "layout (document): 1048622 bytes, more than the limit of 1048576 bytes");
  // A huge unknown key is cut in the path.
  ExpectRefused(
      absl::StrCat(R"J({")J", std::string(60000, 'x'), R"J(": 1, "mesh": {"r": 1}, "rules": []})J"),
      "xxxx... (60000 bytes): unknown field");
  // A huge value where a placement belongs is described, not echoed.
  ExpectRefused(absl::StrCat(R"J({"mesh": {"r": 1}, "rules": [{"match": "*", "placements": [")J",
                             std::string(60000, 'x'), R"J("]}]})J"),
                "layout rules[0].placements[0]: unknown placement \"xxxx");
}

TEST(LayoutSpecHostileTest, FromFileRefusesDirectoriesAndOversizedFiles) {
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  auto spec = LayoutSpec::FromFile(dir);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("is not a regular file"));
  const std::string big = dir + "/big_layout.json";
  std::ofstream(big) << std::string(kMaxLayoutBytes + 1, ' ');
  spec = LayoutSpec::FromFile(big);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("more than the limit of 1048576"));
  // ReadFile (what ckptctl sends to a coordinator) makes the same checks, and parses nothing.
  EXPECT_FALSE(LayoutSpec::ReadFile(dir).ok());
  EXPECT_FALSE(LayoutSpec::ReadFile(big).ok());
  const std::string junk = dir + "/junk_layout.json";
  std::ofstream(junk) << "[[[";
  auto text = LayoutSpec::ReadFile(junk);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "[[[");
}

// The straightforward twin of PiecesOf as it was: each rank's flat range taken from the
// whole EvenFlatSharding of its box (quadratic in ranks, obviously right).
std::vector<TensorPiece> BruteForcePieces(const LayoutSpec& spec, const TensorMeta& tensor) {
  const LayoutRule* rule = *spec.RuleFor(tensor.key);
  const DeviceMesh& mesh = spec.mesh();
  std::vector<LocalShard> shards =
      *ComputeAllLocalShards(tensor.global_shape, mesh, rule->placements);
  std::vector<TensorPiece> pieces;
  for (int64_t rank = 0; rank < mesh.size(); ++rank) {
    const std::vector<int64_t> coord = *mesh.Coordinate(rank);
    TensorPiece piece;
    piece.key = tensor.key;
    piece.rank = rank;
    piece.dtype = tensor.dtype;
    piece.global_shape = tensor.global_shape;
    piece.region = shards[rank].region();
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (!rule->placements[d].is_shard() && (!rule->flat_dim || d != *rule->flat_dim)) {
        piece.replica_id.push_back(coord[d]);
      }
    }
    if (rule->flat_dim) {
      FlatShardingSpec flat =
          *EvenFlatSharding(shards[rank].shape, static_cast<int>(mesh.shape()[*rule->flat_dim]));
      const auto& ranges = flat.unsharded_flattened_offsets[coord[*rule->flat_dim]];
      piece.region.flat = ranges.empty()
                              ? FlatRange{piece.region.BoxElements(), piece.region.BoxElements()}
                              : ranges.front();
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

// Property: PiecesOf (per-rank flat range in O(1)) and RankPieces give exactly the pieces of
// the brute-force twin on random meshes, placements, flat dims and shapes.
TEST(LayoutSpecTest, PiecesEqualTheBruteForceTwin) {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 400; ++iter) {
    const int mesh_dims = 1 + rng() % 3;
    std::string mesh = "{";
    for (int d = 0; d < mesh_dims; ++d) {
      absl::StrAppend(&mesh, d ? ", " : "", "\"m", d, "\": ", 1 + rng() % 5);
    }
    mesh += "}";
    const int ndim = rng() % 4;
    std::vector<int64_t> shape;
    for (int d = 0; d < ndim; ++d) shape.push_back(rng() % 9);
    const int flat = static_cast<int>(rng() % (mesh_dims + 1)) - 1;
    std::string placements;
    for (int d = 0; d < mesh_dims; ++d) {
      const bool shard = ndim > 0 && d != flat && rng() % 2;
      absl::StrAppend(
          &placements, d ? ", " : "",
          shard ? absl::StrCat("\"Shard(", rng() % ndim, ")\"") : std::string("\"Replicate()\""));
    }
    const std::string json = absl::StrCat(
        R"J({"mesh": )J", mesh, R"J(, "rules": [{"match": "*", "placements": [)J", placements, "]",
        flat >= 0 ? absl::StrCat(R"J(, "flat": {"over": "m)J", flat, "\"}") : "", "}]}");
    auto spec = LayoutSpec::Parse(json);
    ASSERT_TRUE(spec.ok()) << json << ": " << spec.status();
    const TensorMeta tensor = Meta("t", shape);
    auto pieces = spec->PiecesOf(tensor);
    ASSERT_TRUE(pieces.ok()) << json << ": " << pieces.status();
    const std::vector<TensorPiece> twin = BruteForcePieces(*spec, tensor);
    ASSERT_EQ(pieces->size(), twin.size());
    for (size_t r = 0; r < twin.size(); ++r) {
      const TensorPiece& p = (*pieces)[r];
      EXPECT_EQ(p.rank, twin[r].rank);
      EXPECT_EQ(p.region, twin[r].region) << json << " rank " << r;
      EXPECT_EQ(p.replica_id, twin[r].replica_id) << json << " rank " << r;
      auto mine = spec->RankPieces({tensor}, static_cast<int64_t>(r));
      ASSERT_TRUE(mine.ok()) << mine.status();
      EXPECT_EQ((*mine)[0].region, twin[r].region) << json << " rank " << r;
      EXPECT_EQ((*mine)[0].replica_id, twin[r].replica_id) << json << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace ckpt
