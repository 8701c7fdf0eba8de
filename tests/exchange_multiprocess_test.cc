// Exchange algorithms across separate processes: this test serves the coordinator's rendezvous
// service on loopback and fork/execs one exchange_rank_main per rank; Gloo connects them over
// TCP. Every rank checks its bytes against the reference. Fault cases: a rank that crashes
// mid-exchange, and a rank that never starts.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/kv_store.h"
#include "rendezvous/loopback_rendezvous.h"
#include "rendezvous/rendezvous_service.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::Env;
using ckpt::testing::ReadFile;

std::string RankBinary() { return ckpt::testing::Runfile("tests/exchange_rank_main"); }

// The result of one rank process.
struct RankExit {
  int code = -1;  // exit code, or -1 if killed after the time limit
  std::string stderr_text;
};

class MultiProcessExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(rendezvous_.ok()); }

  // Starts ranks `ranks` of a group of `size` and waits for all of them (at most `limit`).
  std::vector<RankExit> RunRanks(int size, const std::vector<int>& ranks,
                                 const std::vector<std::string>& common_flags,
                                 const std::vector<std::string>& extra_for_rank0 = {},
                                 int special_rank = -1, absl::Duration limit = absl::Seconds(40)) {
    static int group_counter = 0;
    const std::string group = absl::StrCat("mp", ++group_counter);
    std::vector<pid_t> pids;
    std::vector<std::string> err_paths;
    for (int r : ranks) {
      std::vector<std::string> args = {
          RankBinary(), absl::StrCat("--store=", rendezvous_.address()), absl::StrCat("--rank=", r),
          absl::StrCat("--size=", size), absl::StrCat("--group=", group)};
      args.insert(args.end(), common_flags.begin(), common_flags.end());
      if (r == special_rank)
        args.insert(args.end(), extra_for_rank0.begin(), extra_for_rank0.end());
      std::string err = absl::StrCat(Env("TEST_TMPDIR"), "/", group, "_rank", r, ".err");
      err_paths.push_back(err);
      pid_t pid = fork();
      if (pid == 0) {
        FILE* f = freopen(err.c_str(), "w", stderr);
        (void)f;
        std::vector<char*> argv;
        for (std::string& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
      }
      pids.push_back(pid);
    }
    std::vector<RankExit> exits(pids.size());
    absl::Time until = absl::Now() + limit;
    size_t left = pids.size();
    std::vector<bool> done(pids.size(), false);
    while (left > 0 && absl::Now() < until) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        int status = 0;
        if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
          done[i] = true;
          --left;
          exits[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!done[i]) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
      }
      exits[i].stderr_text = ReadFile(err_paths[i]);
    }
    return exits;
  }

  std::vector<int> AllRanks(int n) {
    std::vector<int> r;
    for (int i = 0; i < n; ++i) r.push_back(i);
    return r;
  }

  LoopbackRendezvous rendezvous_;
};

TEST_F(MultiProcessExchangeTest, AllAlgorithmsMatchTheReferenceAcrossProcesses) {
  for (int n : {1, 2, 4, 8}) {
    for (const char* algorithm :
         {"broadcast", "gather_rounds", "gather_object", "overlap_all_to_all"}) {
      auto exits = RunRanks(n, AllRanks(n),
                            {absl::StrCat("--algorithm=", algorithm), "--seed=21", "--scale=7"});
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(exits[r].code, 0)
            << algorithm << " N=" << n << " rank " << r << ": " << exits[r].stderr_text;
      }
    }
  }
}

TEST_F(MultiProcessExchangeTest, OverlapReshardWithTinyBudgetAcrossProcesses) {
  for (int n : {3, 5}) {
    auto exits = RunRanks(n, AllRanks(n),
                          {"--algorithm=overlap_all_to_all", "--seed=4", "--scale=13",
                           "--reshard=1", "--budget=101"});
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(exits[r].code, 0) << "N=" << n << " rank " << r << ": " << exits[r].stderr_text;
    }
  }
}

TEST_F(MultiProcessExchangeTest, RankThatCrashesMidExchangeFailsTheOthersWithinTheDeadline) {
  for (const char* algorithm : {"broadcast", "overlap_all_to_all"}) {
    absl::Time start = absl::Now();
    auto exits = RunRanks(
        4, AllRanks(4),
        {absl::StrCat("--algorithm=", algorithm), "--scale=9", "--budget=256", "--timeout_ms=5000"},
        {"--exit_at=3"}, /*special_rank=*/2);
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << algorithm;
    EXPECT_EQ(exits[2].code, 17) << exits[2].stderr_text;
    for (int r : {0, 1, 3}) {
      EXPECT_EQ(exits[r].code, 2) << algorithm << " rank " << r << ": " << exits[r].stderr_text;
      EXPECT_TRUE(exits[r].stderr_text.find("UNAVAILABLE") != std::string::npos ||
                  exits[r].stderr_text.find("DEADLINE_EXCEEDED") != std::string::npos)
          << exits[r].stderr_text;
      EXPECT_NE(exits[r].stderr_text.find("rank"), std::string::npos) << exits[r].stderr_text;
    }
  }
}

TEST_F(MultiProcessExchangeTest, RankThatNeverStartsIsNamedByEveryOtherRank) {
  absl::Time start = absl::Now();
  auto exits = RunRanks(3, {0, 2}, {"--algorithm=broadcast", "--timeout_ms=2000"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  for (const RankExit& e : exits) {
    EXPECT_EQ(e.code, 2) << e.stderr_text;
    EXPECT_NE(e.stderr_text.find("ranks [1] never arrived"), std::string::npos) << e.stderr_text;
  }
}

}  // namespace
}  // namespace ckpt
