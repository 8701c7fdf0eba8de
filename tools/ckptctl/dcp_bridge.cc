#include "tools/ckptctl/dcp_bridge.h"

#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/file_util.h"

extern char** environ;

namespace ckpt::ckptctl {
namespace {

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) ? std::string(resolved) : std::string();
}

// Runfiles directories to look in, in order.
std::vector<std::string> RunfilesDirs() {
  std::vector<std::string> dirs;
  if (auto d = Env("RUNFILES_DIR")) dirs.push_back(*d);
  const std::string exe = RealPath("/proc/self/exe");
  if (!exe.empty()) dirs.push_back(exe + ".runfiles");
  if (auto d = Env("TEST_SRCDIR")) dirs.push_back(*d);
  return dirs;
}

absl::StatusOr<std::string> FindPython() {
  if (auto p = Env("CKPT_PYTHON")) return *p;
  std::vector<std::string> tried;
  for (const std::string& dir : RunfilesDirs()) {
    for (const char* sub : {"python_venv/pyvenv.cfg", "ckpt/external/python_venv/pyvenv.cfg"}) {
      const std::string cfg = JoinPath(dir, sub);
      tried.push_back(cfg);
      const std::string real = RealPath(cfg);
      if (!real.empty() && PathExists(JoinPath(ParentDir(real), "bin/python"))) {
        return JoinPath(ParentDir(real), "bin/python");
      }
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the project's Python environment is not found (set CKPT_PYTHON, or build ckptctl with "
      "Bazel after tools/install_deps.sh); looked at ",
      absl::StrJoin(tried, ", ")));
}

absl::StatusOr<std::string> FindInteropPath() {
  if (auto p = Env("CKPT_INTEROP_PATH")) return *p;
  std::vector<std::string> tried;
  for (const std::string& dir : RunfilesDirs()) {
    const std::string path = JoinPath(dir, "ckpt/python/ckpt");
    tried.push_back(path);
    if (PathExists(JoinPath(path, "interop/dcp.py"))) return path;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the DCP converter (python/ckpt/interop) is not found (set "
                   "CKPT_INTEROP_PATH, or build ckptctl with Bazel); looked at ",
                   absl::StrJoin(tried, ", ")));
}

}  // namespace

absl::StatusOr<int> RunDcpConverter(const std::vector<std::string>& args) {
  absl::StatusOr<std::string> python = FindPython();
  if (!python.ok()) return python.status();
  absl::StatusOr<std::string> interop = FindInteropPath();
  if (!interop.ok()) return interop.status();
  std::vector<std::string> argv = {*python, "-m", "interop.dcp"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  // The environment, with PYTHONPATH pointing at the package first.
  std::vector<std::string> env_strings;
  std::string pythonpath = *interop;
  if (auto old = Env("PYTHONPATH")) pythonpath += ":" + *old;
  env_strings.push_back("PYTHONPATH=" + pythonpath);
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) env_strings.push_back(*e);
  }
  std::vector<char*> c_env;
  for (std::string& e : env_strings) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  pid_t pid;
  const int rc =
      ::posix_spawn(&pid, python->c_str(), nullptr, nullptr, c_argv.data(), c_env.data());
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot start ", *python, ": ", std::strerror(rc)));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "wait for the DCP converter");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  // A crash of the interpreter itself (e.g. CPython's C recursion hashing a tuple nested a
  // million deep in a hostile .metadata): name what it was converting.
  return absl::AbortedError(absl::StrCat("the DCP converter (", absl::StrJoin(args, " "),
                                         ") ended by signal ", WTERMSIG(status), " (",
                                         strsignal(WTERMSIG(status)), ")"));
}

TemporaryImport::~TemporaryImport() { RemoveTree(dir_).IgnoreError(); }

absl::StatusOr<std::unique_ptr<TemporaryImport>> ImportDcpTemporarily(const std::string& dcp_dir,
                                                                      int64_t memory_budget) {
  std::string pattern = JoinPath(Env("TMPDIR").value_or("/tmp"), "ckptctl-dcp-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return ErrnoStatus(errno, absl::StrCat("create a temporary directory ", pattern));
  }
  auto imported = std::make_unique<TemporaryImport>(pattern, JoinPath(pattern, "imported"));
  absl::StatusOr<int> code = RunDcpConverter(
      {"import", dcp_dir, imported->path(), "--memory-budget", absl::StrCat(memory_budget)});
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the DCP checkpoint ", dcp_dir,
                                                   " (converter exit status ", *code, ")"));
  }
  return imported;
}

}  // namespace ckpt::ckptctl
