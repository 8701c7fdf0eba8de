// `ckptctl plan`'s input and output files: a regular file is read whole (mapped), a pipe in
// chunks; a directory or a missing file is an error naming it; a mapped input truncated by
// someone else ends the process with a message rather than a crash; output replaces the
// file atomically.
#include "tools/ckptctl/plan_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::ckptctl {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(PlanIoTest, ARegularFileIsReadWhole) {
  const std::string path = TempPath("whole.jsonl");
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "{\"line\": " + std::to_string(i) + "}\n";
  WriteFile(path, text);
  absl::StatusOr<PlanInput> input = ReadPlanInput(path);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->view(), text);
  PlanInput moved = std::move(*input);  // the mapping moves with it
  EXPECT_EQ(moved.view(), text);
}

TEST(PlanIoTest, AnEmptyFileIsEmpty) {
  const std::string path = TempPath("empty.jsonl");
  WriteFile(path, "");
  absl::StatusOr<PlanInput> input = ReadPlanInput(path);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_TRUE(input->view().empty());
}

TEST(PlanIoTest, StdinIsReadToItsEndThroughAPipe) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";  // > a pipe's buffer
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int saved_stdin = ::dup(STDIN_FILENO);
  ASSERT_EQ(::dup2(fds[0], STDIN_FILENO), STDIN_FILENO);
  ::close(fds[0]);
  std::thread writer([&] {
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = ::write(fds[1], text.data() + written, text.size() - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  absl::StatusOr<PlanInput> input = ReadPlanInput(std::nullopt);
  writer.join();
  ::dup2(saved_stdin, STDIN_FILENO);
  ::close(saved_stdin);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->view(), text);
}

TEST(PlanIoTest, ADirectoryOrAMissingFileIsAnErrorNamingIt) {
  const std::string dir = TempPath("");
  absl::StatusOr<PlanInput> directory = ReadPlanInput(dir);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(directory.status().message(), HasSubstr("is a directory"));
  const std::string missing = TempPath("no-such-input.jsonl");
  absl::StatusOr<PlanInput> absent = ReadPlanInput(missing);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr(missing));
}

// A mapped file cut short under the reader: the next read of a page past its new end raises
// SIGBUS, which ends the process with a message (exit status 1) instead of a crash.
TEST(PlanIoDeathTest, AnInputTruncatedWhileReadEndsWithAMessageNotACrash) {
  const std::string path = TempPath("truncated.jsonl");
  WriteFile(path, std::string(1 << 20, 'x'));
  EXPECT_EXIT(
      {
        absl::StatusOr<PlanInput> input = ReadPlanInput(path);
        if (!input.ok()) std::exit(2);
        if (::truncate(path.c_str(), 0) != 0) std::exit(3);
        volatile char last = input->view()[input->view().size() - 1];
        (void)last;
        std::exit(4);  // not reached: the read above faults
      },
      ::testing::ExitedWithCode(1), "the input file was truncated while it was read");
}

TEST(PlanIoTest, HugePageAdviceLeavesAllocationsWorking) {
  UseHugePagesForLargeArrays(size_t{8} << 20);
  std::vector<std::vector<int64_t>> arrays;
  for (int i = 0; i < 8; ++i) arrays.emplace_back(size_t{1} << 20, i);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(arrays[i][12345], i);
}

TEST(PlanIoTest, OutputReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = TempPath("out.jsonl");
  WriteFile(path, "old contents\n");
  ASSERT_TRUE(WritePlanOutput(path, "new\n").ok());
  EXPECT_EQ(ReadFile(path), "new\n");
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
}

TEST(PlanIoTest, OutputIntoAMissingDirectoryIsAnErrorNamingIt) {
  const std::string path = TempPath("no-such-dir/out.jsonl");
  absl::Status status = WritePlanOutput(path, "x\n");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

}  // namespace
}  // namespace ckpt::ckptctl
