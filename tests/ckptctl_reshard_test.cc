// Runs the real `ckptctl reshard` binary on a GPT-style training state saved TP=2 x DP=2 with
// ZeRO-1 flat optimizer shards, into TP=4 x DP=1 and 3-rank uneven layouts; reads every
// destination piece back and checks every element; plus the command's error paths.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

using ckpt::testing::Ckptctl;
using Result = ckpt::testing::CommandResult;
using ckpt::testing::CountLines;  // the command's errors are a single line on stderr

class CkptctlReshardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(ckpt::testing::TmpPath("ckptctl_reshard"));
    ASSERT_TRUE(RemoveTree(*dir_).ok());
    ASSERT_TRUE(MakeDir(*dir_).ok());
    GptConfig c;
    c.layers = 2;
    c.hidden = 64;
    c.vocab = 500;
    tensors_ = new std::vector<TensorMeta>(*GptTensors(c));
    auto source = LayoutSpec::Parse(GptLayoutJson(2, 2));
    ASSERT_TRUE(source.ok()) << source.status();
    src_ = new std::string(JoinPath(*dir_, "src_tp2dp2"));
    auto written = WriteGptCheckpoint(*src_, *tensors_, *source, int64_t{512} << 10, WriteOptions{},
                                      1000, {{"model", "gpt-test"}});
    ASSERT_TRUE(written.ok()) << written.status();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete src_;
    delete tensors_;
  }

  // Writes a layout file and returns its path.
  static std::string LayoutFile(const std::string& name, const std::string& json) {
    const std::string path = JoinPath(*dir_, name + ".json");
    EXPECT_TRUE(WriteFileDurably(path, json).ok());
    return path;
  }

  // Reads back every piece of `layout` from `path` and checks every element.
  static void ExpectHolds(const std::string& path, const std::string& layout_json) {
    auto layout = LayoutSpec::Parse(layout_json);
    ASSERT_TRUE(layout.ok());
    auto report = CheckGptCheckpoint(path, *tensors_, *layout);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->bytes > 0, true);
  }

  static std::string* dir_;
  static std::string* src_;
  static std::vector<TensorMeta>* tensors_;
};

std::string* CkptctlReshardTest::dir_ = nullptr;
std::string* CkptctlReshardTest::src_ = nullptr;
std::vector<TensorMeta>* CkptctlReshardTest::tensors_ = nullptr;

TEST_F(CkptctlReshardTest, TpTwoDpTwoToTpFourAndBack) {
  const std::string tp4 = GptLayoutJson(4, 1);
  const std::string dst = JoinPath(*dir_, "tp4");
  Result r = Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ", LayoutFile("tp4", tp4),
                                  " --memory-budget 1M --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json summary = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << r.out;
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_EQ(summary["bytes_written"].get<int64_t>(), TotalBytes(*tensors_));
  EXPECT_GT(summary["waves"].get<int64_t>(), 1);
  EXPECT_LE(summary["peak_buffer_bytes"].get<int64_t>(), int64_t{1} << 20);
  ExpectHolds(dst, tp4);
  Result v = Ckptctl("verify " + dst);
  EXPECT_EQ(v.code, 0) << v.out << v.err;

  auto reader = CheckpointReader::Open(dst);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->manifest().step(), 1000);
  EXPECT_EQ((*reader)->manifest().user_metadata().at("model"), "gpt-test");
  EXPECT_EQ((*reader)->manifest().saved_layout().world_size(), 4);

  // And back to the source layout, in the human-readable output mode.
  const std::string back = JoinPath(*dir_, "back_tp2dp2");
  r = Ckptctl(absl::StrCat("reshard ", dst, " ", back, " --layout ",
                           LayoutFile("tp2dp2", GptLayoutJson(2, 2)), " --threads 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("resharded"));
  EXPECT_THAT(r.out, HasSubstr("GB/s"));
  ExpectHolds(back, GptLayoutJson(2, 2));
}

TEST_F(CkptctlReshardTest, ThreeRankUnevenLayouts) {
  // Megatron TP=3 (64 and 500 do not divide by 3), and a hand-written 3-rank layout: weights
  // split over dim 1 for everything 2-d, every fp32 state flat over all ranks, vectors whole.
  const std::string custom = R"J({
    "world_size": 3,
    "mesh": {"r": 3},
    "rules": [
      {"match": "optimizer.*", "flat": {"over": "r"}},
      {"regex": ".*\\.weight", "placements": ["Shard(-1)"]},
      {"match": "*", "placements": ["Replicate()"]}
    ]})J";
  for (const auto& [name, json] :
       {std::pair<std::string, std::string>{"tp3", GptLayoutJson(3, 1)}, {"custom3", custom}}) {
    SCOPED_TRACE(name);
    const std::string dst = JoinPath(*dir_, name);
    Result r = Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ",
                                    LayoutFile(name, json), " --memory-budget 2M"));
    ASSERT_EQ(r.code, 0) << r.err;
    ExpectHolds(dst, json);
    Result v = Ckptctl("verify " + dst);
    EXPECT_EQ(v.code, 0) << v.out << v.err;
  }
}

TEST_F(CkptctlReshardTest, MissingSourceFails) {
  Result r = Ckptctl(absl::StrCat("reshard ", JoinPath(*dir_, "no_such"), " ", JoinPath(*dir_, "x"),
                                  " --layout ", LayoutFile("ok", GptLayoutJson(1, 1))));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no_such"));
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_FALSE(PathExists(JoinPath(*dir_, "x")));
}

TEST_F(CkptctlReshardTest, BadLayoutJsonNamesThePath) {
  const std::string bad = LayoutFile("bad", R"J({"mesh": {"tp": 2, "dp": 1}, "rules": [
      {"match": "optimizer.*", "placements": ["Shard(0)", "Replicate()"], "flat": {"over": "dp"}},
      {"match": "*", "placements": ["Replicate()", "Shard(zero)"]}]})J");
  Result r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "y"), " --layout ", bad));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("rules[1].placements[1]"));
  EXPECT_THAT(r.err, HasSubstr("bad.json"));
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_FALSE(PathExists(JoinPath(*dir_, "y")));

  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "y"), " --layout ",
                           LayoutFile("notjson", "{ mesh: ")));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not valid JSON"));
}

TEST_F(CkptctlReshardTest, TensorWithoutRuleIsNamed) {
  const std::string partial = LayoutFile("partial", R"J({"mesh": {"tp": 2}, "rules": [
      {"match": "optimizer.*", "flat": {"over": "tp"}},
      {"match": "*.weight", "placements": ["Shard(0)"]}]})J");
  const std::string dst = JoinPath(*dir_, "z");
  Result r = Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ", partial));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("tensor \"layers.0.input_layernorm.bias\" matches no rule"));
  EXPECT_FALSE(PathExists(dst));
}

TEST_F(CkptctlReshardTest, ExistingDestinationIsKeptWithoutOverwrite) {
  const std::string dst = JoinPath(*dir_, "existing");
  const std::string dp2 = LayoutFile("tp1dp2", GptLayoutJson(1, 2));
  ASSERT_EQ(Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ", dp2)).code, 0);
  const std::string manifest = *ReadWholeFile(JoinPath(dst, "manifest.pb"), 1 << 26);

  const std::string tp4 = LayoutFile("tp4b", GptLayoutJson(4, 1));
  Result r = Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ", tp4));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("already exists"));
  EXPECT_EQ(*ReadWholeFile(JoinPath(dst, "manifest.pb"), 1 << 26), manifest);
  ExpectHolds(dst, GptLayoutJson(1, 2));

  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", dst, " --layout ", tp4, " --overwrite"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(*ReadWholeFile(JoinPath(dst, "manifest.pb"), 1 << 26), manifest);
  ExpectHolds(dst, GptLayoutJson(4, 1));
  EXPECT_EQ(Ckptctl("verify " + dst).code, 0);
}

// --overwrite replaces only a committed checkpoint: a directory of someone's files, a regular
// file and a link to a checkpoint are each refused with a message naming them, and survive.
TEST_F(CkptctlReshardTest, OverwriteRefusesWhatIsNotACheckpoint) {
  const std::string tp4 = LayoutFile("tp4c", GptLayoutJson(4, 1));
  const std::string victims = JoinPath(*dir_, "victims");
  ASSERT_TRUE(MakeDir(victims).ok());
  const std::string home = JoinPath(victims, "home");
  ASSERT_TRUE(MakeDir(home).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(home, "thesis.tex"), "chapter 1").ok());
  const std::string file = JoinPath(victims, "file");
  ASSERT_TRUE(WriteFileDurably(file, "plain text").ok());
  const std::string link = JoinPath(victims, "link");
  ASSERT_EQ(::symlink(src_->c_str(), link.c_str()), 0);
  const std::string src_manifest = *ReadWholeFile(JoinPath(*src_, "manifest.pb"), 1 << 26);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {home, "not a ckpt checkpoint (no manifest.pb)"},
      {file, "a regular file"},
      {link, "a symbolic link"}};
  for (const auto& [victim, what] : cases) {
    Result r =
        Ckptctl(absl::StrCat("reshard ", *src_, " ", victim, " --layout ", tp4, " --overwrite"));
    EXPECT_EQ(r.code, 1) << victim;
    EXPECT_THAT(r.err, HasSubstr(victim));
    EXPECT_THAT(r.err, HasSubstr(what));
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
  EXPECT_EQ(ReadWholeFile(JoinPath(home, "thesis.tex"), 1 << 20).value_or(""), "chapter 1");
  EXPECT_EQ(ReadWholeFile(file, 1 << 20).value_or(""), "plain text");
  char target[4096] = {};
  ASSERT_GT(::readlink(link.c_str(), target, sizeof(target) - 1), 0);
  EXPECT_EQ(std::string(target), *src_);
  EXPECT_EQ(*ReadWholeFile(JoinPath(*src_, "manifest.pb"), 1 << 26), src_manifest);
  EXPECT_EQ(*ListDir(victims), (std::vector<std::string>{"file", "home", "link"}));
}

TEST_F(CkptctlReshardTest, UsageErrorsAndHelp) {
  Result h = Ckptctl("reshard --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_THAT(h.out, HasSubstr("--layout"));
  EXPECT_THAT(h.out, HasSubstr("--memory-budget"));
  Result r = Ckptctl("reshard " + *src_);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(CountLines(r.err), 1);
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u")));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--layout"));
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"),
                           " --layout x.json --memory-budget lots"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--memory-budget"));
  r = Ckptctl(
      absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"), " --layout x.json --bogus"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --bogus"));
  // Flags are kebab-case only: a snake_case spelling is refused, naming the one to use.
  r = Ckptctl(
      absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"), " --layout x.json --no_verify"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("did you mean --no-verify?"));
  // Durations carry their unit.
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"),
                           " --layout x.json --coordinator localhost:1 --timeout 60"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad --timeout \"60\""));
  // Options of one mode are refused in the other; an unreachable coordinator is one line.
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"),
                           " --layout x.json --coordinator localhost:1 --threads 2"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--threads applies only without --coordinator"));
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"),
                           " --layout x.json --max-workers 2"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-workers applies only with --coordinator"));
  const std::string layout = LayoutFile("tp4_usage", GptLayoutJson(4, 1));
  r = Ckptctl(absl::StrCat("reshard ", *src_, " ", JoinPath(*dir_, "u"), " --layout ", layout,
                           " --coordinator 127.0.0.1:1"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_FALSE(PathExists(JoinPath(*dir_, "u")));
}

}  // namespace
}  // namespace ckpt
