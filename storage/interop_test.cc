// Export's file handling: temporary files are created fresh (O_EXCL | O_NOFOLLOW), so a name
// planted next to the output, even as a link to someone else's file, is never written through.
#include "storage/interop.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

TEST(InteropTest, ExportNeverWritesThroughAPlantedTemporaryName) {
  const std::string dir = TestDir("planted");
  std::vector<float> w(16, 1.5f);
  CheckpointContents c;
  c.tensors = {{"w", DType::kF32, {16}}};
  c.files = {{0, {{"w", WholeRegion({16}), w.data(), 64}}}};
  const std::string ckpt = JoinPath(dir, "ckpt");
  ASSERT_TRUE(WriteCheckpoint(ckpt, c, WriteOptions{}).ok());
  const std::string victim = JoinPath(dir, "victim.txt");
  ASSERT_TRUE(WriteFileDurably(victim, "someone else's").ok());
  const std::string out = JoinPath(dir, "out");
  ASSERT_TRUE(MakeDir(out).ok());
  // Links under the temporary names an export in this process could pick.
  std::vector<std::string> planted = {
      JoinPath(out, absl::StrCat("model.safetensors.tmp-", ::getpid()))};
  for (int n = 0; n < 8; ++n) {
    planted.push_back(JoinPath(out, absl::StrCat(".model.safetensors.tmp-", ::getpid(), "-", n)));
  }
  for (const std::string& p : planted) ASSERT_EQ(::symlink(victim.c_str(), p.c_str()), 0);

  auto files = ExportCheckpoint(ckpt, out, ExportOptions{});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(ReadWholeFile(victim, 1 << 20).value_or(""), "someone else's");
  for (const std::string& p : planted) {
    char target[4096] = {};
    ASSERT_GT(::readlink(p.c_str(), target, sizeof(target) - 1), 0) << p << " was replaced";
    EXPECT_EQ(std::string(target), victim);
  }
  auto size = FileSize(JoinPath(out, "model.safetensors"));
  ASSERT_TRUE(size.ok());
  EXPECT_GT(*size, 64);
}

}  // namespace
}  // namespace ckpt
