#include "common/durable_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DurableFileTest, WriteFileAtomicallyReplacesTheWholeFileAndLeavesNoTemporary) {
  const std::string dir = TestDir("replace");
  const std::string path = dir + "/address";
  ASSERT_TRUE(WriteFileAtomically(path, "old\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "127.0.0.1:5000\n").ok());
  EXPECT_EQ(Slurp(path), "127.0.0.1:5000\n");
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
}

TEST(DurableFileTest, WriteFileAtomicallyIntoAMissingDirectoryNamesThePath) {
  const std::string path = TestDir("missing") + "/no/such/dir/ready";
  absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(path + ".tmp"), std::string::npos) << s;
}

TEST(DurableFileTest, AFailedRenameKeepsTheOldFileAndRemovesTheTemporary) {
  const std::string dir = TestDir("rename_fails");
  const std::string path = dir + "/target";
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);  // a non-empty directory cannot be renamed over
  ASSERT_TRUE(WriteFileDurably(path + "/keep", "k").ok());
  absl::Status s = WriteFileAtomically(path, "new");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s;
  EXPECT_EQ(Slurp(path + "/keep"), "k");
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
}

TEST(DurableFileTest, ParentDirOfPaths) {
  EXPECT_EQ(ParentDir("/a/b/c"), "/a/b");
  EXPECT_EQ(ParentDir("/a/b/"), "/a");
  EXPECT_EQ(ParentDir("/a"), "/");
  EXPECT_EQ(ParentDir("a"), ".");
}

}  // namespace
}  // namespace ckpt
