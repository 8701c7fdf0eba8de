// Helpers shared by the tests in tests/: the test's environment and scratch paths, whole-file
// reads and writes, and running a built binary with its output captured. No gtest assertions
// here except where a helper documents them; each returns what it found.
#ifndef CKPT_TESTS_TEST_UTIL_H_
#define CKPT_TESTS_TEST_UTIL_H_

#include <string>

namespace ckpt::testing {

// The environment variable `name`, or "" when unset.
std::string Env(const char* name);

// Bazel's per-test scratch directory ($TEST_TMPDIR), or /tmp outside Bazel.
std::string TestTmpDir();

// TestTmpDir()/name.
std::string TmpPath(const std::string& name);

// TestTmpDir()/name, emptied (removed with its contents, then made again); a gtest failure
// when that does not work.
std::string FreshDir(const std::string& name);

// Path of a file built by Bazel, from the test's runfiles ("tools/ckptctl").
std::string Runfile(const std::string& relative);

// The whole file at `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Replaces the file at `path` with `text`; a gtest failure when that does not work.
void WriteFile(const std::string& path, const std::string& text);

// Whether `path` exists (any kind of file).
bool Exists(const std::string& path);

// Number of '\n' in `text`.
int CountLines(const std::string& text);

// The exit code (-1 when killed by a signal) and the output of a finished command.
struct CommandResult {
  int code = -1;
  std::string out, err;
};

// Runs `binary` with `args` (a shell command line, e.g. "verify /x --json") and waits for it;
// stdout and stderr are captured through files under TestTmpDir().
CommandResult RunBinary(const std::string& binary, const std::string& args);

// RunBinary on the built tools/ckptctl (the test needs it in its data).
CommandResult Ckptctl(const std::string& args);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_UTIL_H_
