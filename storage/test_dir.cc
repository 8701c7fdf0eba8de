#include "storage/test_dir.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "storage/file_util.h"

namespace ckpt {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", name);
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_TRUE(MakeDir(dir).ok());
  return dir;
}

}  // namespace ckpt
