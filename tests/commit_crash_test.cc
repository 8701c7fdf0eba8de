// Kills a checkpoint writer process (SIGKILL from the parent) at every step of the commit
// protocol, and in the middle of writing data, then checks that the checkpoint path holds
// either the previous checkpoint or the complete new one, never a half state, and that a
// later write still succeeds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

// An empty scratch directory for one test.
std::string TestDir(const std::string& name) { return ckpt::testing::FreshDir(name); }

// Version `v` of a two-tensor model, 4 MiB in three files; contents depend on v.
struct Model {
  std::vector<float> w, b;
  CheckpointContents contents;
  explicit Model(int v) : w(1 << 20), b(1000) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(v * 1000003 + i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(-v - static_cast<int>(i));
    contents.tensors = {{"w", DType::kF32, {1024, 1024}}, {"b", DType::kF32, {1000}}};
    contents.step = v;
    contents.files = {
        {0, {{"w", Region{{0, 0}, {512, 1024}, std::nullopt}, w.data(), 512 * 1024 * 4}}},
        {1,
         {{"w", Region{{512, 0}, {512, 1024}, std::nullopt}, w.data() + 512 * 1024,
           512 * 1024 * 4}}},
        {1, {{"b", WholeRegion({1000}), b.data(), 4000}}}};
  }
};

// The checkpoint at `path` is complete, loads and verifies, and holds version `v`.
void ExpectVersion(const std::string& path, int v, const std::string& context) {
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << context << ": " << reader.status();
  Model want(v);
  std::vector<float> w(1 << 20), b(1000);
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({1024, 1024}), w.data()).ok()) << context;
  ASSERT_TRUE((*reader)->ReadRegion("b", WholeRegion({1000}), b.data()).ok()) << context;
  EXPECT_EQ((*reader)->manifest().step(), v) << context;
  EXPECT_TRUE(w == want.w) << context;
  EXPECT_TRUE(b == want.b) << context;
}

WriteOptions Options(bool overwrite) {
  WriteOptions o;
  o.overwrite = overwrite;
  o.io.num_threads = 2;
  o.io.buffer_bytes = 256 << 10;
  return o;
}

// Bytes in the regular files under `dir` outside `exclude` (files may vanish meanwhile).
int64_t BytesUnder(const std::string& dir, const std::string& exclude) {
  namespace fs = std::filesystem;
  std::error_code error;
  int64_t total = 0;
  for (fs::recursive_directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it->path().string().rfind(exclude, 0) == 0) continue;
    std::error_code size_error;
    const uintmax_t size = fs::is_regular_file(it->path(), size_error)
                               ? fs::file_size(it->path(), size_error)
                               : uintmax_t{0};
    if (!size_error) total += static_cast<int64_t>(size);
  }
  return total;
}

// Whether child `pid` has exited (it is left unreaped).
bool Exited(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

// Forks a child that writes version `v` into the directory of `path`; `stop_at` (when set) makes
// the child report the step through a pipe and wait there to be killed. Without it, the parent
// kills the child once its staging files hold `kill_after_bytes` bytes (or it exited first).
// Returns once the child is dead.
void RunAndKill(const std::string& path, int v, bool overwrite, const CommitStep* stop_at,
                int64_t kill_after_bytes) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    Model m(v);
    WriteOptions o = Options(overwrite);
    o.after_step = [&](CommitStep step) {
      if (step == CommitStep::kStagingCreated && stop_at == nullptr) {
        char c = 's';
        (void)!::write(fds[1], &c, 1);
      }
      if (stop_at != nullptr && step == *stop_at) {
        char c = 'k';
        (void)!::write(fds[1], &c, 1);
        while (true) ::pause();  // wait for SIGKILL
      }
    };
    auto result = WriteCheckpoint(path, m.contents, o);
    ::_exit(result.ok() ? 0 : 3);
  }
  ::close(fds[1]);
  char c = 0;
  const ssize_t n = ::read(fds[0], &c, 1);
  ::close(fds[0]);
  if (stop_at == nullptr && n == 1) {
    // Watches the data land (a poll of the observable condition, bounded by a deadline).
    const std::string dir = path.substr(0, path.rfind('/'));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (BytesUnder(dir, path) < kill_after_bytes && !Exited(pid) && absl::Now() < deadline) {
      std::this_thread::yield();
    }
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  if (stop_at != nullptr) {
    ASSERT_EQ(n, 1) << "writer exited before reaching " << CommitStepName(*stop_at);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }
}

bool CommittedAt(CommitStep step) {
  return step == CommitStep::kCheckpointRenamed || step == CommitStep::kOldRemoved;
}

TEST(CommitCrashTest, KillAtEachStepOfAFreshSaveLeavesNothingOrTheWholeCheckpoint) {
  for (CommitStep step : kAllCommitSteps) {
    const std::string dir = TestDir(std::string("fresh_") + CommitStepName(step));
    const std::string path = JoinPath(dir, "ckpt");
    RunAndKill(path, 2, /*overwrite=*/false, &step, 0);
    const std::string context = std::string("killed after ") + CommitStepName(step);
    const CheckpointProbe probe = ProbeCheckpoint(path);
    if (CommittedAt(step)) {
      ExpectVersion(path, 2, context);
    } else {
      EXPECT_EQ(probe.state, CheckpointState::kMissing) << context;
      EXPECT_FALSE(CheckpointReader::Open(path).ok()) << context;
      EXPECT_FALSE(probe.leftovers.empty()) << context << ": staging dir should be reported";
    }
    // The next save is not blocked by what the dead writer left behind.
    Model m(3);
    auto again = WriteCheckpoint(path, m.contents, Options(/*overwrite=*/true));
    ASSERT_TRUE(again.ok()) << context << ": " << again.status();
    ExpectVersion(path, 3, context + ", then saved again");
  }
}

TEST(CommitCrashTest, KillAtEachStepOfAnOverwriteKeepsTheOldOrTheNewCheckpoint) {
  for (CommitStep step : kAllCommitSteps) {
    const std::string dir = TestDir(std::string("over_") + CommitStepName(step));
    const std::string path = JoinPath(dir, "ckpt");
    Model old(1);
    ASSERT_TRUE(WriteCheckpoint(path, old.contents, Options(false)).ok());
    RunAndKill(path, 2, /*overwrite=*/true, &step, 0);
    const std::string context = std::string("overwrite killed after ") + CommitStepName(step);
    ExpectVersion(path, CommittedAt(step) ? 2 : 1, context);
  }
}

TEST(CommitCrashTest, KillWhileDataIsBeingWrittenKeepsTheOldCheckpoint) {
  std::mt19937 rng(5);
  for (int i = 0; i < 6; ++i) {
    const std::string dir = TestDir("midwrite" + std::to_string(i));
    const std::string path = JoinPath(dir, "ckpt");
    Model old(1);
    ASSERT_TRUE(WriteCheckpoint(path, old.contents, Options(false)).ok());
    // Somewhere in the 4 MiB of data files.
    RunAndKill(path, 2, /*overwrite=*/true, nullptr, static_cast<int64_t>(rng() % (4 << 20)));
    // Depending on timing the child may have finished; either way only complete versions.
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const int64_t step = (*reader)->manifest().step();
    ASSERT_TRUE(step == 1 || step == 2);
    ExpectVersion(path, static_cast<int>(step), "mid-write kill " + std::to_string(i));
  }
}

}  // namespace
}  // namespace ckpt
