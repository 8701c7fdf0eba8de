// Runs the real `ckptctl plan` binary on JSON Lines files and checks its output.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/distribute.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

using ckpt::testing::Exists;
using ckpt::testing::ReadFile;
using ckpt::testing::TmpPath;
using ckpt::testing::WriteFile;

std::string Binary() { return ckpt::testing::Runfile("tools/ckptctl"); }

struct RunResult {
  int exit_code = -1;
  std::string out;  // --output file (or stdout when use_stdio)
  std::string err;
  bool out_exists = false;
};

// Runs `ckptctl plan <mode>` on `input`, via files or via stdin/stdout.
RunResult RunPlan(const std::string& mode, const std::string& input, bool use_stdio = false,
                  const std::string& extra_args = "") {
  static int counter = 0;
  const std::string tag = std::to_string(++counter);
  const std::string in = TmpPath("in" + tag), out = TmpPath("out" + tag),
                    err = TmpPath("err" + tag);
  WriteFile(in, input);
  std::remove(out.c_str());
  std::string cmd = Binary() + " plan " + mode + " " + extra_args;
  cmd += use_stdio ? " < " + in + " > " + out : " --input " + in + " --output " + out;
  cmd += " 2> " + err;
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out_exists = Exists(out);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::vector<Json> Lines(const std::string& text) {
  std::vector<Json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(Json::parse(line, nullptr, false));
  return lines;
}

TEST(CkptctlPlanTest, DistributePrintsAssignmentInVisitingOrder) {
  const std::string input =
      R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [0, 1]], [["b", [0], [0, 4]], [1]],)"
      R"( [["c", [0], null], [0, 1]]], "shard_to_size": [[["a", [0], null], 10],)"
      R"( [["b", [0], [0, 4]], 4], [["c", [0], null], 3]], "cross_group": []})"
      "\n";
  RunResult r = RunPlan("distribute", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  // b (1 holder) -> 1; a (10 bytes) -> 0; c: loads (10, 4) -> 1.
  EXPECT_EQ(lines[0]["assignment"], Json::parse(R"([[["b",[0],[0,4]],1],[["a",[0],null],0],)"
                                                R"([["c",[0],null],1]])"));
  EXPECT_TRUE(lines[0]["plan_seconds"].is_number());
  EXPECT_GE(lines[0]["plan_seconds"].get<double>(), 0.0);
}

TEST(CkptctlPlanTest, OneOutputLinePerInputLineViaStdinAndStdout) {
  const std::string one =
      R"({"num_ranks": 3, "shard_to_ranks": [[["k", [], null], [2, 1]]], "shard_to_size": [[["k", [], null], 1]]})";
  const std::string input = one + "\n\n" + one + "\r\n" + one;  // blank line skipped, CRLF ok
  RunResult r = RunPlan("distribute", input, /*use_stdio=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u);
  for (const Json& l : lines) EXPECT_EQ(l["assignment"], Json::parse(R"([[["k",[],null],1]])"));
}

TEST(CkptctlPlanTest, IntegralFloatsAndUnknownFieldsAccepted) {
  const std::string input =
      R"({"num_ranks": 2.0, "note": "x", "shard_to_ranks": [[["\u00e9", [1.0, 2], [0.0, 3e0]], [1.0]]],)"
      R"( "shard_to_size": [[["\u00e9", [1, 2.0], [0, 3]], 12.0], [["unused", [], null], 1]],)"
      R"( "cross_group": [["\u00e9", [1, 2], [0, 3]], ["unused", [], null]]})"
      "\n";
  RunResult r = RunPlan("distribute", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["assignment"], Json::parse(R"([[["\u00e9",[1,2],[0,3]],1]])"));
}

TEST(CkptctlPlanTest, MalformedLineNamesLineAndFieldAndWritesNothing) {
  const std::string good =
      R"({"num_ranks": 1, "shard_to_ranks": [[["a", [0], null], [0]]], "shard_to_size": [[["a", [0], null], 1]]})";
  const std::string bad =
      R"({"num_ranks": 1, "shard_to_ranks": [[["a", [0.5], null], [0]]], "shard_to_size": []})";
  RunResult r = RunPlan("distribute", good + "\n" + bad + "\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("line 2"));
  EXPECT_THAT(r.err, HasSubstr("shard_to_ranks[0][0][1][0]"));
  EXPECT_FALSE(r.out_exists);  // --output is written only on success

  RunResult s = RunPlan("distribute", good + "\n" + bad + "\n", /*use_stdio=*/true);
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_EQ(s.out, "");  // stdout too: nothing half-written
}

TEST(CkptctlPlanTest, InvalidJsonAndMissingFieldsAreReported) {
  RunResult a = RunPlan("distribute", "{not json\n");
  EXPECT_EQ(a.exit_code, 1);
  EXPECT_THAT(a.err, HasSubstr("line 1: not valid JSON"));
  RunResult b = RunPlan("distribute", R"({"num_ranks": 1, "shard_to_ranks": []})");
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_THAT(b.err, HasSubstr("field shard_to_size: missing"));
  RunResult neg =
      RunPlan("distribute", R"({"num_ranks": -1, "shard_to_ranks": [], "shard_to_size": []})");
  EXPECT_EQ(neg.exit_code, 1);
  EXPECT_THAT(neg.err, HasSubstr("field num_ranks"));
  RunResult c =
      RunPlan("main-replicas", R"({"num_ranks": 2, "per_rank": [[[["a",[0],null], 1, 1]], []]})");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_THAT(c.err, HasSubstr("per_rank[0][0][2]"));
}

TEST(CkptctlPlanTest, PlannerErrorsNameTheShards) {
  RunResult nosize = RunPlan(
      "distribute",
      R"({"num_ranks": 1, "shard_to_ranks": [[["w", [3], null], [0]]], "shard_to_size": []})");
  EXPECT_EQ(nosize.exit_code, 1);
  EXPECT_THAT(nosize.err, HasSubstr("shard_to_size"));
  EXPECT_THAT(nosize.err, HasSubstr("('w', (3,), None)"));
  RunResult tie = RunPlan(
      "distribute",
      R"({"num_ranks": 1, "shard_to_ranks": [[["k", [0], null], [0]], [["k", [0], [0, 2]], [0]]],)"
      R"( "shard_to_size": [[["k", [0], null], 2], [["k", [0], [0, 2]], 2]]})");
  EXPECT_EQ(tie.exit_code, 1);
  EXPECT_THAT(tie.err, HasSubstr("('k', (0,), None)"));
  EXPECT_THAT(tie.err, HasSubstr("('k', (0,), (0, 2))"));
  RunResult noholder = RunPlan(
      "distribute",
      R"({"num_ranks": 2, "shard_to_ranks": [[["w", [], null], []]], "shard_to_size": [[["w", [], null], 1]]})");
  EXPECT_EQ(noholder.exit_code, 1);
  EXPECT_THAT(noholder.err, HasSubstr("('w', (), None) has no holder"));
}

// Issue 11 finding 4: each of these aborted (std::bad_alloc, an uncaught iostream exception)
// or was silently ignored.
TEST(CkptctlPlanTest, HostileInputsGetOneLineErrors) {
  // --input naming a directory aborted on basic_filebuf's exception.
  RunResult dir = RunPlan("distribute", "", /*use_stdio=*/true, "--input " + TmpPath(""));
  EXPECT_EQ(dir.exit_code, 1);
  EXPECT_THAT(dir.err, HasSubstr("is a directory"));

  // num_ranks 10^9 allocated a load per rank (std::bad_alloc on smaller machines).
  const std::string one_shard =
      R"("shard_to_ranks": [[["a", [0], null], [0]]], "shard_to_size": [[["a", [0], null], 1]]})";
  RunResult huge = RunPlan("distribute", R"({"num_ranks": 1000000000, )" + one_shard + "\n");
  EXPECT_EQ(huge.exit_code, 1);
  EXPECT_THAT(huge.err, HasSubstr("line 1: field num_ranks: 1000000000 is outside [0, 1048576]"));
  RunResult huge_group = RunPlan("main-replicas", R"({"num_ranks": 1000000000, "per_rank": []})");
  EXPECT_EQ(huge_group.exit_code, 1);
  EXPECT_THAT(huge_group.err, HasSubstr("field num_ranks: 1000000000 is outside"));

  // A holder rank >= num_ranks (or negative) was silently skipped.
  const std::string good = R"({"num_ranks": 2, )" + one_shard;
  RunResult rank = RunPlan(
      "distribute",
      good + "\n" +
          R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [1, 7]]], "shard_to_size": [[["a", [0], null], 1]]})");
  EXPECT_EQ(rank.exit_code, 1);
  EXPECT_THAT(rank.err,
              HasSubstr("line 2: field shard_to_ranks[0][1][1]: rank 7 is outside [0, 2)"));
  EXPECT_FALSE(rank.out_exists);
  // --keep-out-of-range-ranks keeps Megatron's behaviour: counted, never chosen.
  RunResult kept = RunPlan(
      "distribute",
      R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [1, 7]]], "shard_to_size": [[["a", [0], null], 1]]})",
      /*use_stdio=*/false, "--keep-out-of-range-ranks");
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(Lines(kept.out)[0]["assignment"], Json::parse(R"([[["a",[0],null],1]])"));
  RunResult negative = RunPlan(
      "distribute",
      R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [-1, 0]]], "shard_to_size": [[["a", [0], null], 1]]})");
  EXPECT_THAT(negative.err, HasSubstr("rank -1 is outside [0, 2)"));

  // A repeated key silently won (the last value).
  RunResult repeated = RunPlan("distribute", R"({"num_ranks": 1, "num_ranks": 2, )" + one_shard);
  EXPECT_EQ(repeated.exit_code, 1);
  EXPECT_THAT(repeated.err, HasSubstr("line 1: key \"num_ranks\" appears twice in this object"));

  // A group of one with the wrong number of lists was accepted.
  RunResult lists = RunPlan("main-replicas", R"({"num_ranks": 1, "per_rank": [[], [], []]})");
  EXPECT_EQ(lists.exit_code, 1);
  EXPECT_THAT(lists.err, HasSubstr("field per_rank: has 3 lists for num_ranks 1"));

  // Deep nesting is refused before a DOM exists, with the path.
  RunResult deep =
      RunPlan("distribute", R"({"num_ranks": 1, "shard_to_ranks": )" + std::string(100000, '[') +
                                std::string(100000, ']') + "}");
  EXPECT_EQ(deep.exit_code, 1);
  EXPECT_THAT(deep.err, HasSubstr("line 1: field shard_to_ranks[0][0]"));
  EXPECT_THAT(deep.err, HasSubstr("nested deeper than the limit of 16 levels"));
  EXPECT_LT(deep.err.size(), 1000u);

  // Sizes that add up past int64 would overflow a rank's load.
  RunResult sizes = RunPlan(
      "distribute",
      R"({"num_ranks": 1, "shard_to_ranks": [[["a", [0], null], [0]], [["b", [0], null], [0]]],)"
      R"( "shard_to_size": [[["a", [0], null], 9223372036854775807], [["b", [0], null], 1]]})");
  EXPECT_EQ(sizes.exit_code, 1);
  EXPECT_THAT(sizes.err, HasSubstr("past 2^63 - 1 bytes"));
}

TEST(CkptctlPlanTest, MainReplicasSaveAndLoadModes) {
  const std::string per_rank =
      R"("per_rank": [[[["a",[0],null], 8, false], [["b",[0],null], 100, false]],)"
      R"( [[["a",[0],null], 8, true], [["b",[0],null], 100, false], [["c",[0],null], 2, true]]])";
  RunResult save =
      RunPlan("main-replicas", R"({"num_ranks": 2, "ignore_groups": false, )" + per_rank + "}");
  ASSERT_EQ(save.exit_code, 0) << save.err;
  auto s = Lines(save.out);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["distribution"], Json::parse(R"({
      "main_rank_for_shard": [[["c",[0],null],1],[["a",[0],null],0]],
      "shards_in_this_group": [["a",[0],null],["c",[0],null]],
      "all_ranks_for_shard": [[["a",[0],null],[0,1]],[["c",[0],null],[1]]]})"));
  EXPECT_TRUE(s[0]["plan_seconds"].is_number());

  RunResult load =
      RunPlan("main-replicas", R"({"num_ranks": 2, "ignore_groups": true, )" + per_rank + "}");
  ASSERT_EQ(load.exit_code, 0) << load.err;
  auto l = Lines(load.out);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0]["distribution"]["main_rank_for_shard"],
            Json::parse(R"([[["c",[0],null],1],[["a",[0],null],0],[["b",[0],null],1]])"));
  EXPECT_EQ(l[0]["distribution"]["shards_in_this_group"],
            Json::parse(R"([["a",[0],null],["b",[0],null],["c",[0],null]])"));
}

TEST(CkptctlPlanTest, MainReplicasGroupOfOneIsNull) {
  RunResult r =
      RunPlan("main-replicas", R"({"num_ranks": 1, "per_rank": [[[["a",[0],null], 8, true]]]})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"distribution\":null}\n");
}

TEST(CkptctlPlanTest, HelpAndUsageErrors) {
  EXPECT_EQ(std::system((Binary() + " plan --help > /dev/null").c_str()), 0);
  EXPECT_EQ(std::system((Binary() + " plan distribute --help > /dev/null").c_str()), 0);
  int status = std::system((Binary() + " plan frobnicate 2> /dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  status = std::system((Binary() + " plan distribute --bogus 2> /dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  RunResult missing = RunPlan("distribute", "", /*use_stdio=*/true, "--input /nonexistent/file");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot open input file /nonexistent/file"));
}

// The CLI's output equals the library's straightforward implementation on random problems.
TEST(CkptctlPlanTest, RandomProblemsMatchTheLibrary) {
  std::mt19937_64 rng(7);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::string input;
  std::vector<DistributionInput> problems;
  for (int p = 0; p < 20; ++p) {
    DistributionInput in;
    in.num_ranks = pick(1, 40);
    Json to_ranks = Json::array(), to_size = Json::array(), cross = Json::array();
    const int n = static_cast<int>(pick(1, 60));
    for (int i = 0; i < n; ++i) {
      PieceId id{"t" + std::to_string(i % 7), {pick(0, 3), i}, std::nullopt};
      if (i % 3 == 0) id.flat = FlatRange{0, pick(1, 9)};
      std::vector<int64_t> holders;
      for (int h = 0, k = static_cast<int>(pick(1, 6)); h < k; ++h) {
        holders.push_back(pick(0, in.num_ranks - 1));  // repeats allowed; out of range is an error
      }
      holders.push_back(pick(0, in.num_ranks - 1));
      const int64_t size = pick(0, 5) * 64;
      const bool is_cross = pick(0, 4) == 0;
      Json jid = Json::array(
          {id.key, id.offsets, id.flat ? Json::array({id.flat->start, id.flat->stop}) : Json()});
      to_ranks.push_back(Json::array({jid, holders}));
      to_size.push_back(Json::array({jid, size}));
      if (is_cross) cross.push_back(jid);
      in.AddShard(id, size, holders, is_cross);
    }
    input += Json{{"num_ranks", in.num_ranks},
                  {"shard_to_ranks", to_ranks},
                  {"shard_to_size", to_size},
                  {"cross_group", cross}}
                 .dump() +
             "\n";
    problems.push_back(std::move(in));
  }
  RunResult r = RunPlan("distribute", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), problems.size());
  for (size_t p = 0; p < problems.size(); ++p) {
    auto expected = DistributeShardsToRanksReference(problems[p]);
    ASSERT_TRUE(expected.ok()) << expected.status();
    Json want = Json::array();
    for (const ShardAssignment& a : *expected) {
      const PieceId& id = problems[p].shards[a.shard].id;
      want.push_back(Json::array(
          {Json::array({id.key, id.offsets,
                        id.flat ? Json::array({id.flat->start, id.flat->stop}) : Json()}),
           a.rank}));
    }
    EXPECT_EQ(lines[p]["assignment"], want) << "problem " << p;
  }
}

}  // namespace
}  // namespace ckpt
