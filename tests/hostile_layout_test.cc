// Hostile target layouts (issue 11, findings 3 and 4) sent through the real `ckptctl reshard`,
// both to a real ckpt_coordinator on loopback (--coordinator) and offline: JSON nested
// 200,000 deep, a regex of 100,000 nested parentheses, (.*.*)*X, '.*' against a
// 100,000-character tensor key, world sizes up to 2^31 and a repeated mesh dim. Each used to
// crash the coordinator (SIGSEGV in the gRPC handler) or ckptctl, hang, abort with
// std::bad_alloc, or be silently accepted. Now each gets a one-line error naming the problem
// (or, for the patterns that are merely slow for backtracking engines, a correct reshard),
// and the coordinator stays alive and serves the next request.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_util.h"
#include "tests/services_cluster.h"

namespace ckpt {
namespace {

using testing::Cluster;
using ::testing::HasSubstr;

constexpr char kReplicateAll[] = R"J("rules": [{"match": "*", "placements": ["Replicate()"]}])J";

// One hostile layout and what the reshard must answer: exit code 0, or 1 with `expected` in
// the output.
struct Hostile {
  std::string name;
  std::string json;
  bool long_key_source = false;  // reshard the checkpoint with a 100,000-character key
  bool succeeds = false;
  std::string expected;
  std::string expected_on_coordinator = "";  // when it differs from `expected`
};

std::vector<Hostile> HostileLayouts() {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string parens = std::string(100000, '(') + "a" + std::string(100000, ')');
  return {
      {"deep_mesh_value", absl::StrCat(R"J({"mesh": {"r": )J", deep, "}, ", kReplicateAll, "}"),
       false, false, "layout mesh.r[0][0]"},
      {"deep_document", deep, false, false, "nested deeper than the limit of 16 levels"},
      {"deep_unclosed", std::string(200000, '['), false, false,
       "nested deeper than the limit of 16 levels"},
      {"regex_nested_parens",
       absl::StrCat(R"J({"mesh": {"r": 1}, "rules": [{"regex": ")J", parens,
                    R"J(", "placements": ["Replicate()"]}]})J"),
       false, false, "layout rules[0].regex: a string of 200001 bytes, more than the limit"},
      {"regex_unsupported",
       R"J({"mesh": {"r": 1}, "rules": [{"regex": "(?=x).*", "placements": ["Replicate()"]}]})J",
       false, false, "layout rules[0].regex: invalid regex \"(?=x).*\""},
      {"world_2_31", absl::StrCat(R"J({"mesh": {"r": 2147483648}, )J", kReplicateAll, "}"), false,
       false, "layout mesh.r: 2147483648 is more than the limit of 1048576"},
      {"world_product_overflow",
       R"J({"mesh": {"a": 1048576, "b": 1048576, "c": 1048576, "d": 1048576},
            "rules": [{"match": "*", "placements": ["Replicate()", "Replicate()", "Replicate()", "Replicate()"]}]})J",
       false, false, "has more than the limit of 1048576 ranks"},
      {"repeated_mesh_dim", absl::StrCat(R"J({"mesh": {"r": 2, "r": 4}, )J", kReplicateAll, "}"),
       false, false, "layout mesh: key \"r\" appears twice in this object"},
      // Exponential for a backtracking engine (it pinned a core forever); linear for RE2.
      {"catastrophic_regex",
       R"J({"mesh": {"r": 2}, "rules": [{"regex": "(.*.*)*X", "placements": ["Shard(0)"]},
                                        {"match": "*", "placements": ["Replicate()"]}]})J",
       false, true, ""},
      // std::regex recursed once per character until the stack overflowed.
      {"dot_star_long_key",
       R"J({"mesh": {"r": 2}, "rules": [{"regex": ".*", "placements": ["Shard(0)"]}]})J", true,
       true, ""},
      // The coordinator refuses it before it places a rank (it used to register 10^6 of them,
      // which took longer than ckptctl's deadline on a busy machine).
      {"world_10_6", absl::StrCat(R"J({"mesh": {"r": 1000000}, )J", kReplicateAll, "}"), false,
       false, "pieces, more than the limit of 16777216",
       "1000000 ranks over 1 live worker(s) is more than the limit of 1024 ranks per worker"},
  };
}

class HostileLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = JoinPath(cluster_.dir(), "ckpt");
    ASSERT_TRUE(MakeDir(ck_).ok());
    GptConfig c;
    c.layers = 1;
    c.hidden = 32;
    c.vocab = 64;
    auto tensors = GptTensors(c);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    gpt_tensors_ = *tensors;
    auto tp2 = LayoutSpec::Parse(GptLayoutJson(2, 1));
    ASSERT_TRUE(tp2.ok()) << tp2.status();
    gpt_src_ = JoinPath(ck_, "gpt");
    auto written = WriteGptCheckpoint(gpt_src_, gpt_tensors_, *tp2, int64_t{1} << 20, {});
    ASSERT_TRUE(written.ok()) << written.status();
    // One tensor whose key is 100,000 characters long, and a short one.
    long_tensors_ = {TensorMeta{std::string(100000, 'k'), DType::kF32, {6, 4}},
                     TensorMeta{"short", DType::kF32, {4}}};
    auto one = LayoutSpec::Parse(absl::StrCat(R"J({"mesh": {"r": 1}, )J", kReplicateAll, "}"));
    ASSERT_TRUE(one.ok()) << one.status();
    long_src_ = JoinPath(ck_, "long");
    written = WriteGptCheckpoint(long_src_, long_tensors_, *one, int64_t{1} << 20, {});
    ASSERT_TRUE(written.ok()) << written.status();
  }

  std::string LayoutFile(const Hostile& h) {
    const std::string path = JoinPath(cluster_.dir(), h.name + ".json");
    EXPECT_TRUE(WriteFileDurably(path, h.json).ok());
    return path;
  }

  // Runs `ckptctl reshard` of the hostile case's source into a fresh destination and checks
  // the answer; `extra` selects the coordinator.
  void ExpectAnswered(const Hostile& h, const std::vector<std::string>& extra) {
    const std::string dst = JoinPath(ck_, "dst_" + h.name + (extra.empty() ? "" : "_cluster"));
    std::vector<std::string> args = {"reshard", h.long_key_source ? long_src_ : gpt_src_, dst,
                                     "--layout", LayoutFile(h)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string out;
    const absl::Time start = absl::Now();
    const int code = cluster_.RunCkptctl(args, &out);
    std::printf("%s%s -> %d in %.2f s\n", h.name.c_str(), extra.empty() ? "" : " (coordinator)",
                code, absl::ToDoubleSeconds(absl::Now() - start));  // for the log
    SCOPED_TRACE(h.name + ": " + out.substr(0, 2000));
    if (h.succeeds) {
      ASSERT_EQ(code, 0);
      auto layout = LayoutSpec::Parse(h.json);
      ASSERT_TRUE(layout.ok()) << layout.status();
      auto report =
          CheckGptCheckpoint(dst, h.long_key_source ? long_tensors_ : gpt_tensors_, *layout);
      EXPECT_TRUE(report.ok()) << report.status();
      return;
    }
    EXPECT_EQ(code, 1);
    EXPECT_THAT(out, HasSubstr(extra.empty() || h.expected_on_coordinator.empty()
                                   ? h.expected
                                   : h.expected_on_coordinator));
    EXPECT_LT(out.size(), 2000u) << "one short line, not an echo of the input";
    EXPECT_FALSE(PathExists(dst));
  }

  Cluster cluster_;
  std::string ck_, gpt_src_, long_src_;
  std::vector<TensorMeta> gpt_tensors_, long_tensors_;
};

TEST_F(HostileLayoutTest, CoordinatorAnswersEachAndKeepsServing) {
  cluster_.StartCoordinator({});
  cluster_.StartWorker(0);
  for (const Hostile& h : HostileLayouts()) {
    ExpectAnswered(h, {"--coordinator", cluster_.address()});
    ASSERT_TRUE(cluster_.coordinator().Running()) << "the coordinator died on " << h.name;
    EXPECT_EQ(testing::LiveWorkers(cluster_.Status()), 1) << "after " << h.name;
  }
  // And the next ordinary request is served.
  Hostile ordinary{"ordinary", GptLayoutJson(4, 1), false, true, ""};
  ExpectAnswered(ordinary, {"--coordinator", cluster_.address()});
}

TEST_F(HostileLayoutTest, OfflineReshardAnswersEach) {
  for (const Hostile& h : HostileLayouts()) ExpectAnswered(h, {});
}

}  // namespace
}  // namespace ckpt
