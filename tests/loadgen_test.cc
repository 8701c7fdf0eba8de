// ckpt_loadgen at CI size: 2,048 simulated ranks over 16 simulated workers against a real
// ckpt_coordinator process on loopback. Checks that the save commits a checkpoint that verifies
// (sparse, all-zero data files) and that the load of it completes for every rank; prints the
// figures (timings are benchmarks, never asserted here).
#include <sys/wait.h>

#include <cstdint>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

// The words after "<key> " on the line starting with it, split at spaces.
std::vector<std::string> Words(const std::string& text, const std::string& key) {
  return absl::StrSplit(LineValue(text, key), ' ', absl::SkipEmpty());
}

// The value following `name` among a line's words ("" when absent).
std::string ValueOf(const std::vector<std::string>& words, const std::string& name) {
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == name) return words[i + 1];
  }
  return "";
}

// Runs the CI-size save and load (with `extra` flags) and checks their outcome; returns the
// loadgen's report.
std::string SaveAndLoad(const std::vector<std::string>& extra) {
  Cluster cluster;  // for its scratch directory, process reaping and ckptctl
  std::vector<std::string> argv = {Runfile("tools/loadgen/ckpt_loadgen"),
                                   "--ranks=2048",
                                   "--workers=16",
                                   "--hosts=1",
                                   "--layout=tp8pp16",
                                   "--model=small",
                                   "--spawn-coordinator=" + Runfile("coordinator/ckpt_coordinator"),
                                   "--checkpoint-root=" + cluster.dir(),
                                   "--keep-checkpoint",
                                   "--operation-timeout-s=240"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Child* loadgen = cluster.Start(argv, "loadgen");
  EXPECT_EQ(waitpid(loadgen->pid, &loadgen->status, 0), loadgen->pid);
  loadgen->reaped = true;
  const std::string out = loadgen->Stdout();
  std::cout << out << std::flush;
  EXPECT_TRUE(WIFEXITED(loadgen->status) && WEXITSTATUS(loadgen->status) == 0) << out << "\n"
                                                                               << loadgen->Stderr();
  EXPECT_EQ(LineValue(out, "result"), "ok");

  for (const std::string kind : {"save", "load"}) {
    std::vector<std::string> outcome = Words(out, kind + " id");
    EXPECT_GE(outcome.size(), 3u) << out;
    EXPECT_EQ(ValueOf(outcome, "phase"), "done") << out;
    // Every rank got its plan part over its worker's stream.
    std::vector<std::string> plan = Words(out, kind + " joins_answered_s");
    EXPECT_EQ(ValueOf(plan, "plan_parts"), "2048") << out;
    // Every rank was told the operation's end.
    EXPECT_EQ(ValueOf(Words(out, kind + " waits"), "ranks_told"), "2048") << out;
    // The coordinator logged its planner's own time, and the loadgen read it.
    double planner = -1, planner_cpu = -1;
    const std::vector<std::string> timing = Words(out, kind + " planner_s");
    EXPECT_TRUE(absl::SimpleAtod(timing.empty() ? "-" : timing[0], &planner)) << out;
    EXPECT_TRUE(absl::SimpleAtod(ValueOf(timing, "planner_cpu_s"), &planner_cpu)) << out;
    EXPECT_GT(planner, 0) << out;
    EXPECT_GT(planner_cpu, 0) << out;
  }
  int files = 0;
  EXPECT_TRUE(absl::SimpleAtoi(ValueOf(Words(out, "save joins_answered_s"), "files"), &files));
  EXPECT_GT(files, 0);
  EXPECT_EQ(ValueOf(Words(out, "errors"), "report_result"), "0");
  // Which libgrpc each process ran, read from its memory map: both name a file.
  EXPECT_THAT(ValueOf(Words(out, "grpc"), "coordinator"), ::testing::HasSubstr("/libgrpc.so"));
  EXPECT_THAT(ValueOf(Words(out, "grpc"), "loadgen"), ::testing::HasSubstr("/libgrpc.so"));

  // The committed checkpoint is a real one: headers, sizes, checksums (of zeros) and coverage.
  std::string verify;
  EXPECT_EQ(cluster.RunCkptctl({"verify", cluster.dir() + "/loadgen-ckpt"}, &verify), 0) << verify;
  std::cout << verify << std::flush;
  return out;
}

// The number after `name` on the line starting with `key` (-1 when absent).
int64_t NumberOf(const std::string& out, const std::string& key, const std::string& name) {
  int64_t n = -1;
  if (!absl::SimpleAtoi(ValueOf(Words(out, key), name), &n)) return -1;
  return n;
}

TEST(LoadgenTest, TwoThousandRanksSaveAndLoadThroughARealCoordinator) {
  const std::string out = SaveAndLoad({});
  EXPECT_EQ(ValueOf(Words(out, "shards_per_rank_max"), "compact"), "0");
  // By default each worker's 128 ranks are told the end by the worker's WatchWork stream, as
  // the worker daemon tells its trainers (worker/operation_ends.h): no WaitOperation call.
  // Joins are coalesced as worker/coordinator_joins does for trainers arriving together: each
  // worker's 128 ranks in one JoinOperations call (the load's by digest), plus, for the save, at
  // most one more per worker with the full descriptions of the layout classes the coordinator asked
  // it for (here each worker holds a pipeline stage of its own, so each is asked once).
  for (const std::string kind : {"save", "load"}) {
    EXPECT_EQ(NumberOf(out, kind + " waits", "wait_calls"), 0) << out;
    EXPECT_EQ(NumberOf(out, kind + " waits", "ends_on_streams"), 16) << out;
  }
  // A saving rank's worker asks once for its status when it snapshotted the rank (what the
  // trainer's Save returns with); a load has no snapshot.
  EXPECT_EQ(NumberOf(out, "save waits", "snapshot_calls"), 2048) << out;
  EXPECT_EQ(NumberOf(out, "load waits", "snapshot_calls"), 0) << out;
  EXPECT_GE(NumberOf(out, "save waits", "join_calls"), 16) << out;
  EXPECT_LE(NumberOf(out, "save waits", "join_calls"), 32) << out;
  EXPECT_EQ(NumberOf(out, "load waits", "join_calls"), 16) << out;
}

// Ranks of different data-parallel replicas share a layout class: the coordinator asks one
// rank of each class for its description in full and the others join by reference (issue
// 16). 2,048 ranks over 256 workers of 8: 16 pipeline stages x 8 TP ranks = 128 classes, one
// supplier each; --no-class-references sends every description in full.
TEST(LoadgenTest, OneRankPerLayoutClassDescribesItInFullTheOthersByReference) {
  const std::string by_class = SaveAndLoad({"--workers=256"});
  const std::vector<std::string> joins = Words(by_class, "save joins_by_digest");
  EXPECT_EQ(ValueOf(joins, "full_state_resends"), "128") << by_class;
  EXPECT_EQ(ValueOf(joins, "joins_by_class"), "1920") << by_class;
  const std::string in_full = SaveAndLoad({"--workers=256", "--no-class-references"});
  const std::vector<std::string> full = Words(in_full, "save joins_by_digest");
  EXPECT_EQ(ValueOf(full, "full_state_resends"), "0") << in_full;
  EXPECT_EQ(ValueOf(full, "joins_by_class"), "0") << in_full;
}

// --no-join-linger: each worker's first rank joins alone, its other 127 in the next call.
// (With --execute-while-dispatching too: the parts are executed as they arrive, the loadgen's
// older way, and --rank-waits=per-worker: each worker waits for its ranks by WaitOperation
// calls, as workers did before streams brought the ends; the operations complete the same.)
TEST(LoadgenTest, WithoutTheJoinLingerEachWorkerJoinsInTwoCalls) {
  const std::string out =
      SaveAndLoad({"--no-join-linger", "--execute-while-dispatching", "--rank-waits=per-worker"});
  for (const std::string kind : {"save", "load"}) {
    const int64_t calls = NumberOf(out, kind + " waits", "wait_calls");
    EXPECT_GE(calls, 16) << out;
    EXPECT_LT(calls, 2048) << out;
  }
  EXPECT_GE(NumberOf(out, "save waits", "join_calls"), 32) << out;
  EXPECT_LE(NumberOf(out, "save waits", "join_calls"), 64) << out;  // + the classes asked for
  EXPECT_EQ(NumberOf(out, "load waits", "join_calls"), 32) << out;
}

// --rank-waits=per-rank --per-rank-joins: every rank waits and joins through its own calls.
TEST(LoadgenTest, PerRankWaitsAndJoinsMakeAtLeastOneCallOfEachPerRank) {
  const std::string out = SaveAndLoad({"--rank-waits=per-rank", "--per-rank-joins"});
  for (const std::string kind : {"save", "load"}) {
    EXPECT_GE(NumberOf(out, kind + " waits", "wait_calls"), 2048) << out;
    EXPECT_GE(NumberOf(out, kind + " waits", "join_calls"), 2048) << out;
  }
}

// Runs the loadgen with `flag` beside valid ones; expects the usage error (exit 2) before any
// coordinator starts and returns its stderr.
std::string RefusedUsage(const std::string& flag) {
  Cluster cluster;
  Child* loadgen = cluster.Start({Runfile("tools/loadgen/ckpt_loadgen"), "--ranks=128", flag,
                                  "--spawn-coordinator=" + Runfile("coordinator/ckpt_coordinator"),
                                  "--checkpoint-root=" + cluster.dir()},
                                 "loadgen");
  EXPECT_EQ(waitpid(loadgen->pid, &loadgen->status, 0), loadgen->pid);
  loadgen->reaped = true;
  EXPECT_TRUE(WIFEXITED(loadgen->status) && WEXITSTATUS(loadgen->status) == 2) << flag;
  return loadgen->Stderr();
}

// A boolean flag given a value is refused with a usage error naming it, not taken as set
// (--execute-while-dispatching=false used to turn it on), before any coordinator starts.
TEST(LoadgenTest, ABooleanFlagGivenAValueIsRefusedNamingIt) {
  EXPECT_THAT(RefusedUsage("--execute-while-dispatching=false"),
              ::testing::HasSubstr("--execute-while-dispatching takes no value"));
}

// An unknown way to wait is refused naming it and the ways there are.
TEST(LoadgenTest, AnUnknownRankWaitsIsRefusedNamingTheChoices) {
  const std::string err = RefusedUsage("--rank-waits=long-poll");
  EXPECT_THAT(err, ::testing::HasSubstr("\"long-poll\" is none of stream, per-worker"));
}

// Every line of `text` that starts with `key`, its words after the key.
std::vector<std::vector<std::string>> EveryLine(const std::string& text, const std::string& key) {
  std::vector<std::vector<std::string>> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, key + " ")) {
      out.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
    }
  }
  return out;
}

// A repeat save reuses the plan, and its workers, which kept their parts' bodies, are sent
// only the tails naming the new staging directory (worker/kept_plan_parts).
TEST(LoadgenTest, ARepeatSaveSendsOnlyTheTailsOfThePartsItsWorkersKept) {
  const std::string out = SaveAndLoad({"--repeat=2"});
  const auto reuse = EveryLine(out, "save joins_by_digest");
  const auto plans = EveryLine(out, "save joins_answered_s");
  ASSERT_EQ(reuse.size(), 2u) << out;
  ASSERT_EQ(plans.size(), 2u) << out;
  EXPECT_EQ(ValueOf(reuse[1], "plan_reused"), "1") << out;
  double first = 0, second = 0;
  ASSERT_TRUE(absl::SimpleAtod(ValueOf(plans[0], "plan_bytes"), &first)) << out;
  ASSERT_TRUE(absl::SimpleAtod(ValueOf(plans[1], "plan_bytes"), &second)) << out;
  EXPECT_GT(first, 100'000) << out;
  EXPECT_LT(second * 4, first) << out;
  EXPECT_EQ(ValueOf(plans[1], "plan_parts"), "2048") << out;
}

// The same with every rank described compactly (issue 16): the coordinator expands the
// descriptions into the same pieces, so the checkpoint verifies just the same.
TEST(LoadgenTest, CompactDescriptionsAreExpandedIntoACheckpointThatVerifies) {
  const std::string out = SaveAndLoad({"--compact"});
  const std::vector<std::string> described = Words(out, "shards_per_rank_max");
  EXPECT_EQ(ValueOf(described, "compact"), ValueOf(described, "shards_total")) << out;
}

}  // namespace
}  // namespace ckpt::testing
