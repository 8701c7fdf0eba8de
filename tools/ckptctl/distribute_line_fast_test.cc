// Property tests of distribute's fast path (tools/ckptctl/distribute_line_fast.h) against its
// brute-force twin, the DOM path (json_guard + nlohmann): on random well-formed lines and on
// hostile mutations of them, whatever the fast parser accepts the DOM path accepts with the
// same DistributionInput; and the one-buffer writer writes nlohmann's dump() byte for byte.
#include "tools/ckptctl/distribute_line_fast.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/distribute.h"
#include "tools/ckptctl/plan_lines.h"

namespace ckpt::ckptctl {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Keys: mostly plain ASCII; sometimes with escapes, quotes, control or non-ASCII characters
// (which the fast path leaves to the DOM path).
std::string RandomKey(std::mt19937_64& rng) {
  static const char* const kOdd[] = {"\\\"", "\\\\", "\\n", "\\u00e9", "é", "\\u0001", "\\/"};
  std::string key = "layer" + std::to_string(rng() % 50);
  if (rng() % 10 == 0) key += kOdd[rng() % 7];
  return key + ".weight";
}

std::string Sep(std::mt19937_64& rng) {
  static const char* const kSpace[] = {"", "", " ", "\t", "\r\n "};
  return kSpace[rng() % 5];
}

std::string RandomInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const int64_t v = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  switch (rng() % 40) {
    case 0:
      return std::to_string(v) + ".0";  // integral float: DOM only
    case 1:
      return std::to_string(v) + "e0";
    case 2:
      return "-0";
    default:
      return std::to_string(v);
  }
}

std::string RandomId(std::mt19937_64& rng, const std::string& key, int shard) {
  const std::string s = Sep(rng);
  std::string id =
      "[" + s + "\"" + key + "\"," + s + "[" + std::to_string(shard * 128) + "," + s + "0]," + s;
  id += (shard % 3 == 0) ? "[" + std::to_string(shard) + "," + std::to_string(shard + 4) + "]"
                         : "null";
  return id + s + "]";
}

// One distribute line: mostly valid, sometimes with a repeated shard, a missing size, an
// out-of-range rank, fields reordered or unknown, Python's separators.
std::string RandomLine(std::mt19937_64& rng) {
  const int num_ranks = 1 + static_cast<int>(rng() % 16);
  const int shards = static_cast<int>(rng() % 12);
  std::vector<std::string> ids;
  for (int i = 0; i < shards; ++i) {
    const int shard = (rng() % 15 == 0 && i > 0) ? i - 1 : i;  // sometimes a repeat
    ids.push_back(RandomId(rng, RandomKey(rng), shard));
  }
  std::string ranks = "[", sizes = "[", cross = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string holders = "[";
    for (int h = 0, n = 1 + static_cast<int>(rng() % 4); h < n; ++h) {
      holders += (h ? "," : "") + Sep(rng) + RandomInt(rng, rng() % 30 ? 0 : -1, num_ranks);
    }
    ranks += (i ? "," : "") + Sep(rng) + "[" + ids[i] + "," + holders + "]]";
    if (rng() % 20 != 0)
      sizes += std::string(i ? "," : "") + "[" + ids[i] + "," + RandomInt(rng, 0, 1 << 20) + "]";
    if (rng() % 4 == 0) cross += std::string(cross.size() > 1 ? "," : "") + ids[i];
  }
  ranks += "]", sizes += "]", cross += "]";
  const std::string c = Sep(rng) + ":" + Sep(rng);
  std::vector<std::string> fields = {"\"num_ranks\"" + c + RandomInt(rng, 0, num_ranks),
                                     "\"shard_to_ranks\"" + c + ranks,
                                     "\"shard_to_size\"" + c + sizes};
  if (rng() % 2) fields.push_back("\"cross_group\"" + c + cross);
  if (rng() % 10 == 0) fields.push_back("\"comment\"" + c + "\"x\"");
  if (rng() % 8 == 0) std::swap(fields[rng() % fields.size()], fields[rng() % fields.size()]);
  std::string line = Sep(rng) + "{";
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + Sep(rng) + fields[i];
  return line + Sep(rng) + "}" + Sep(rng);
}

// Hostile versions: truncated, a byte replaced, a byte inserted, a bracket or quote dropped.
std::string Mutate(std::mt19937_64& rng, std::string line) {
  static const char kBytes[] = "[]{},:\"\\-0123456789.eEnul \x01\x7f\xff";
  if (line.empty()) return line;
  const size_t at = rng() % line.size();
  switch (rng() % 4) {
    case 0:
      return line.substr(0, at);
    case 1:
      line[at] = kBytes[rng() % (sizeof(kBytes) - 1)];
      return line;
    case 2:
      return line.insert(at, 1, kBytes[rng() % (sizeof(kBytes) - 1)]);
    default:
      return line.erase(at, 1);
  }
}

// The fast path's compact input and ids against the DOM path's DistributionInput: same
// shards, ids, sizes, cross flags and holder lists (a rank outside [0, N), kept as Megatron
// keeps it, is -1 in the compact form), and each id written as the DOM path writes it.
void ExpectSameInput(const FastDistributeLine& fast, const DistributionInput& dom,
                     const std::string& line) {
  const CompactDistributionInput& in = fast.input;
  ASSERT_EQ(in.num_ranks, dom.num_ranks) << line;
  ASSERT_EQ(in.shards.size(), dom.shards.size()) << line;
  ASSERT_EQ(fast.ids.ends.size(), dom.shards.size() + 1) << line;
  const FormattedShardIds dom_ids = FormatShardIds(dom);
  EXPECT_EQ(fast.ids.text(), dom_ids.text()) << line;
  EXPECT_EQ(fast.ids.ends, dom_ids.ends) << line;
  for (size_t i = 0; i < in.shards.size(); ++i) {
    const CompactDistributionInput::Shard& s = in.shards[i];
    EXPECT_EQ(in.IdOf(static_cast<int32_t>(i)), dom.shards[i].id) << line;
    const std::optional<int64_t> size = s.size_bytes == CompactDistributionInput::kNoSize
                                            ? std::nullopt
                                            : std::optional<int64_t>(s.size_bytes);
    EXPECT_EQ(size, dom.shards[i].size_bytes) << line;
    EXPECT_EQ(s.cross_group, dom.shards[i].cross_group) << line;
    std::vector<int64_t> holders(in.holders.begin() + in.list_start[s.holder_list],
                                 in.holders.begin() + in.list_start[s.holder_list + 1]);
    std::vector<int64_t> expected = dom.holder_lists[dom.shards[i].holder_list];
    for (int64_t& r : expected) r = r >= 0 && r < dom.num_ranks ? r : -1;
    EXPECT_EQ(holders, expected) << line;
  }
}

// Checks one line both ways; returns whether the fast path took it.
bool CheckTwin(const std::string& line, bool keep_out_of_range) {
  PlanOptions options;
  options.keep_out_of_range_ranks = keep_out_of_range;
  std::optional<FastDistributeLine> fast = ParseDistributeLineFast(line, keep_out_of_range);
  absl::StatusOr<DistributionInput> dom = ParseDistributeLineViaDom(line, options);
  if (!fast) return false;
  if (dom.ok()) {
    ExpectSameInput(*fast, *dom, line);
  } else {
    // The one check left to the planner: a shard repeated in shard_to_ranks.
    EXPECT_FALSE(DistributeShardsToRanks(fast->input).ok())
        << "fast path accepted a line the DOM path refuses (" << dom.status() << "): " << line;
  }
  return true;
}

TEST(DistributeLineFastTest, AcceptsOnlyWhatTheDomPathAcceptsAndBuildsTheSameInput) {
  std::mt19937_64 rng(16);
  int taken = 0, refused_by_dom = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string line = RandomLine(rng);
    if (CheckTwin(line, rng() % 2 == 0)) ++taken;
    if (!ParseDistributeLineViaDom(line).ok()) ++refused_by_dom;
  }
  // Both kinds occur (about 3,300 lines go the fast way), so the comparison is not vacuous.
  EXPECT_GT(taken, 2500);
  EXPECT_GT(refused_by_dom, 1000);
}

TEST(DistributeLineFastTest, HostileMutationsAreNeverAcceptedWhereTheDomPathRefuses) {
  std::mt19937_64 rng(1616);
  int taken = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string line = RandomLine(rng);
    for (int m = 0, n = 1 + static_cast<int>(rng() % 3); m < n; ++m) line = Mutate(rng, line);
    if (CheckTwin(line, rng() % 2 == 0)) ++taken;
  }
  EXPECT_GT(taken, 50);  // about 120 mutated lines stay in the fast path's subset
}

TEST(DistributeLineFastTest, RefusesWhatItLeavesToTheDomPath) {
  const std::string ok = R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [1]]], )"
                         R"("shard_to_size": [[["a", [0], null], 8]]})";
  ASSERT_TRUE(ParseDistributeLineFast(ok, false).has_value());
  for (const std::string& line :
       {std::string(R"({"num_ranks": 2.0, "shard_to_ranks": [], "shard_to_size": []})"),
        std::string(R"({"num_ranks": 2, "num_ranks": 2, "shard_to_ranks": [], )"
                    R"("shard_to_size": []})"),
        std::string(R"({"num_ranks": 1, "shard_to_ranks": [[["a", [0], null], [1]]], )"
                    R"("shard_to_size": [[["a", [0], null], 8]]})"),  // rank out of range
        std::string(R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [1]]], )"
                    R"("shard_to_size": []})"),  // no size
        std::string(R"({"num_ranks": 2, "shard_to_ranks": [[["\u0061", [0], null], [1]]], )"
                    R"("shard_to_size": [[["a", [0], null], 8]]})"),
        std::string(R"({"num_ranks": 2, "shard_to_ranks": [], "shard_to_size": []} x)"),
        std::string(R"({"num_ranks": 2, "shard_to_ranks": [], "shard_to_size": [],})"),
        std::string(R"({"num_ranks": 12345678901234567890, "shard_to_ranks": [], )"
                    R"("shard_to_size": []})"),
        std::string(R"({"num_ranks": 2, "shard_to_ranks": [], "shard_to_size": [], )"
                    R"("extra": 1})")}) {
    EXPECT_FALSE(ParseDistributeLineFast(line, false).has_value()) << line;
  }
}

TEST(DistributeLineFastTest, ARepeatedShardGetsTheDomPathsErrorNamingItsField) {
  const std::string line =
      R"({"num_ranks": 2, "shard_to_ranks": [[["a", [0], null], [1]], [["a", [0], null], [0]]], )"
      R"("shard_to_size": [[["a", [0], null], 8]]})";
  absl::StatusOr<std::string> result = RunPlanLine(PlanMode::kDistribute, line);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            RunPlanLineViaDom(PlanMode::kDistribute, line).status().message());
  EXPECT_NE(result.status().message().find("field shard_to_ranks[1]: repeats shard"),
            absl::string_view::npos)
      << result.status();
}

// The writer against nlohmann's dump() of the same object (what the command wrote before).
TEST(DistributeLineFastTest, WriterMatchesNlohmannDumpByteForByte) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> keys = {
      "a", "layer1.weight", "q\"uote", "back\\slash", "tab\t", "\x01", "é", "\x7f", ""};
  for (int round = 0; round < 200; ++round) {
    DistributionInput input;
    input.num_ranks = 8;
    std::vector<ShardAssignment> assignment;
    OrderedJson pairs = OrderedJson::array();
    for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i) {
      PieceId id{keys[rng() % keys.size()], {}, std::nullopt};
      for (int d = 0, dims = static_cast<int>(rng() % 3); d < dims; ++d) {
        id.offsets.push_back(static_cast<int64_t>(rng() % 1000) - 10);
      }
      if (rng() % 2) id.flat = FlatRange{static_cast<int64_t>(rng() % 9), INT64_MAX};
      OrderedJson offsets(id.offsets);
      OrderedJson flat = id.flat ? OrderedJson::array({id.flat->start, id.flat->stop}) : nullptr;
      const int64_t rank = static_cast<int64_t>(rng() % 8);
      pairs.push_back(OrderedJson::array({OrderedJson::array({id.key, offsets, flat}), rank}));
      assignment.push_back(ShardAssignment{input.AddShard(id, 1, {rank}), rank});
    }
    const double seconds = (rng() % 3 == 0) ? 0.0 : static_cast<double>(rng() % 100000) * 1e-7;
    OrderedJson out;
    out["assignment"] = std::move(pairs);
    out["plan_seconds"] = seconds;
    EXPECT_EQ(FormatDistributeResult(input, assignment, seconds),
              out.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace));
  }
}

// The whole line both ways, plan_seconds aside: the command's output does not depend on
// which path read the line.
TEST(DistributeLineFastTest, RunPlanLineGivesTheDomPathsOutputAndErrors) {
  std::mt19937_64 rng(99);
  auto masked = [](absl::StatusOr<std::string> s) {
    if (!s.ok()) return std::string(s.status().ToString());
    return s->substr(0, s->rfind("\"plan_seconds\":"));
  };
  for (int i = 0; i < 3000; ++i) {
    std::string line = RandomLine(rng);
    if (i % 2) line = Mutate(rng, line);
    EXPECT_EQ(masked(RunPlanLine(PlanMode::kDistribute, line)),
              masked(RunPlanLineViaDom(PlanMode::kDistribute, line)))
        << line;
  }
}

}  // namespace
}  // namespace ckpt::ckptctl
