#include "tests/test_util.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace ckpt::testing {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string TestTmpDir() {
  const std::string dir = Env("TEST_TMPDIR");
  return dir.empty() ? "/tmp" : dir;
}

std::string TmpPath(const std::string& name) { return TestTmpDir() + "/" + name; }

std::string FreshDir(const std::string& name) {
  const std::string dir = TmpPath(name);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  EXPECT_FALSE(ec) << "cannot remove " << dir << ": " << ec.message();
  std::filesystem::create_directories(dir, ec);
  EXPECT_FALSE(ec) << "cannot make " << dir << ": " << ec.message();
  return dir;
}

std::string Runfile(const std::string& relative) {
  const std::string srcdir = Env("TEST_SRCDIR"), workspace = Env("TEST_WORKSPACE");
  return (srcdir.empty() ? "." : srcdir) + "/" + (workspace.empty() ? "ckpt" : workspace) + "/" +
         relative;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
}

int CountLines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

CommandResult RunBinary(const std::string& binary, const std::string& args) {
  static std::atomic<int> runs{0};
  const std::string base = TmpPath("run" + std::to_string(++runs));
  const std::string command = binary + " " + args + " >" + base + ".out 2>" + base + ".err";
  const int status = std::system(command.c_str());
  CommandResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

CommandResult Ckptctl(const std::string& args) { return RunBinary(Runfile("tools/ckptctl"), args); }

}  // namespace ckpt::testing
