// `ckptctl gc` end to end on the real binary: only incomplete ckpt staging directories of dead
// writers are removed, each printed with its size; complete ones are kept, look-alikes refused,
// live writers' skipped, and --dry-run removes nothing. And in process: a directory swapped for a
// symlink during the removal never makes gc remove what the symlink points to.
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_util.h"
#include "storage/remove_tree_test_hook.h"
#include "tests/services_cluster.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The pid of a process that has exited (and been reaped).
pid_t DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

TEST(CkptctlGcTest, RemovesOnlyIncompleteStagingDirectoriesOfDeadWritersAndSaysWhat) {
  Cluster cluster;  // for its scratch directory and RunCkptctl
  const std::string dir = cluster.dir() + "/ckpts";
  ASSERT_TRUE(MakeDir(dir).ok());
  const pid_t dead = DeadPid();
  auto staging = [&](const std::string& name) {
    const std::string path = JoinPath(dir, name);
    EXPECT_TRUE(MakeDir(path).ok());
    EXPECT_TRUE(MakeDir(JoinPath(path, "data")).ok());
    return path;
  };
  const std::string leftover = staging(absl::StrCat(".step5.tmp-", dead, "-0"));
  WriteFile(JoinPath(leftover, "data/r0_0.safetensors"), std::string(3 << 20, 'x'));
  const std::string complete = staging(absl::StrCat(".step6.tmp-", dead, "-1"));
  WriteFile(JoinPath(complete, "data/r0_0.safetensors"), std::string(10, 'x'));
  WriteFile(JoinPath(complete, "manifest.pb"), std::string(10, 'x'));
  const std::string lookalike = staging(absl::StrCat(".thesis.tmp-", dead, "-2"));
  WriteFile(JoinPath(lookalike, "chapter1.tex"), std::string(10, 'x'));
  const std::string live = staging(absl::StrCat(".step7.tmp-", getpid(), "-0"));
  const std::string checkpoint = JoinPath(dir, "step4");
  ASSERT_TRUE(MakeDir(checkpoint).ok());

  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"gc", "--dry-run", dir}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("would remove " + leftover + " (3.00 MiB)"));
  EXPECT_TRUE(PathExists(leftover));

  ASSERT_EQ(cluster.RunCkptctl({"gc", dir}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed " + leftover + " (3.00 MiB)"));
  EXPECT_THAT(out, HasSubstr("kept " + complete));
  EXPECT_THAT(out, HasSubstr("complete checkpoint under a staging name"));
  EXPECT_THAT(out, HasSubstr("refused " + lookalike));
  EXPECT_THAT(out, HasSubstr("holds chapter1.tex"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("skipped ", live)));
  EXPECT_THAT(out, HasSubstr("gc: 1 removed (3.00 MiB), 1 kept, 1 skipped, 1 refused"));
  EXPECT_THAT(out, Not(HasSubstr(checkpoint)));
  EXPECT_FALSE(PathExists(leftover));
  for (const std::string& stays : {complete, lookalike, live, checkpoint}) {
    EXPECT_TRUE(PathExists(stays)) << stays;
  }
  // Named directly, a look-alike is refused too; a missing directory is an error.
  ASSERT_EQ(cluster.RunCkptctl({"gc", lookalike}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("refused " + lookalike));
  EXPECT_TRUE(PathExists(lookalike));
  EXPECT_EQ(cluster.RunCkptctl({"gc", dir + "/missing"}, &out), 1) << out;
  EXPECT_THAT(out, HasSubstr(dir + "/missing"));
  EXPECT_EQ(cluster.RunCkptctl({"gc"}, &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("name at least one directory (see ckptctl gc --help)"));
  // The old snake_case spelling is refused, naming the flag to use, and removes nothing.
  EXPECT_EQ(cluster.RunCkptctl({"gc", "--dry_run", dir}, &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("did you mean --dry-run?"));
}

// Issue 39: a user who can write in DIR waits until gc has renamed a staging directory aside
// (".discard-") and listed its data/, then swaps data/ for a symlink to a victim directory
// holding files of the same names. gc runs in process here, so that RemoveTree's testonly hook
// makes the swap at exactly that moment. No victim file may go, and gc must fail naming the
// swapped directory rather than print "removed".
TEST(CkptctlGcTest, DataSwappedForASymlinkDuringRemovalLeavesTheVictimsFilesAndFails) {
  Cluster cluster;  // for its scratch directory
  const std::string dir = cluster.dir() + "/ckpts";
  const std::string victim = cluster.dir() + "/victim";
  ASSERT_TRUE(MakeDir(dir).ok());
  ASSERT_TRUE(MakeDir(victim).ok());
  const std::string staging = JoinPath(dir, absl::StrCat(".step5.tmp-", DeadPid(), "-0"));
  ASSERT_TRUE(MakeDir(staging).ok());
  ASSERT_TRUE(MakeDir(JoinPath(staging, "data")).ok());
  constexpr int kFiles = 200;
  for (int i = 0; i < kFiles; ++i) {
    const std::string name = absl::StrCat("r0_", i, ".safetensors");
    WriteFile(JoinPath(staging, "data/" + name), "");
    WriteFile(JoinPath(victim, name), "victim");
  }
  std::string swapped;
  ScopedRemoveTreeHook hook([&](const std::string& listed) {
    if (!swapped.empty() || BaseName(listed) != "data" || !absl::StrContains(listed, ".discard-")) {
      return;
    }
    swapped = listed;
    ASSERT_EQ(::rename(listed.c_str(), JoinPath(dir, "moved").c_str()), 0);
    ASSERT_EQ(::symlink(victim.c_str(), listed.c_str()), 0);
  });
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = ckptctl::RunGcCommand({"gc", dir});
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(swapped.empty()) << out << err;
  absl::StatusOr<std::vector<std::string>> left = ListDir(victim);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->size(), kFiles) << out << err;
  EXPECT_EQ(code, 1) << out << err;
  EXPECT_THAT(err, HasSubstr(absl::StrCat("not removing ", swapped)));
  EXPECT_THAT(err, HasSubstr("replaced while being removed"));
  EXPECT_THAT(out, Not(HasSubstr("removed " + staging)));
  EXPECT_THAT(out, HasSubstr("gc: 0 removed (0 B), 0 kept, 0 skipped, 0 refused, 1 failed"));
}

}  // namespace
}  // namespace ckpt::testing
