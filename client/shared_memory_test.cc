#include "client/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

bool SegmentExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::string TestPrefix() { return absl::StrCat("/ckpt.alloctest.p", getpid(), "."); }

TEST(SharedAllocatorTest, SmallAllocationsShareAnAlignedZeroFilledArena) {
  SharedAllocator allocator(TestPrefix());
  auto a = allocator.Allocate(10, "a");
  auto b = allocator.Allocate(100, "b");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->segment, b->segment);
  EXPECT_EQ(a->offset, 0);
  EXPECT_EQ(b->offset, 64);
  EXPECT_EQ(a->segment->size(), SharedAllocator::kArenaBytes);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(b->data()[i], std::byte{0});
  EXPECT_TRUE(absl::StartsWith(a->segment->name(), TestPrefix()));
}

TEST(SharedAllocatorTest, LargeAllocationGetsItsOwnSegment) {
  SharedAllocator allocator(TestPrefix());
  auto small = allocator.Allocate(8, "small");
  auto large = allocator.Allocate(SharedAllocator::kSmallBytes + 1, "large");
  ASSERT_TRUE(small.ok() && large.ok());
  EXPECT_NE(small->segment, large->segment);
  EXPECT_EQ(large->offset, 0);
  EXPECT_EQ(large->segment->size(), SharedAllocator::kSmallBytes + 1);
}

TEST(SharedAllocatorTest, FindLocatesBytesInsideALiveSegmentOnly) {
  SharedAllocator allocator(TestPrefix());
  auto a = allocator.Allocate(256, "a");
  ASSERT_TRUE(a.ok());
  auto found = allocator.Find(a->data() + 16, 32);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->segment, a->segment);
  EXPECT_EQ(found->offset, 16);
  // Past the segment's end, and memory the allocator never handed out.
  EXPECT_FALSE(allocator.Find(a->data(), SharedAllocator::kArenaBytes + 1).has_value());
  int local = 0;
  EXPECT_FALSE(allocator.Find(&local, sizeof(local)).has_value());
}

TEST(SharedAllocatorTest, SegmentIsUnlinkedWhenTheLastAllocationGoes) {
  SharedAllocator allocator(TestPrefix());
  std::string name;
  const std::byte* data = nullptr;
  {
    auto a = allocator.Allocate(SharedAllocator::kSmallBytes * 2, "big");
    ASSERT_TRUE(a.ok());
    name = a->segment->name();
    data = a->data();
    EXPECT_TRUE(SegmentExists(name));
  }
  EXPECT_FALSE(SegmentExists(name));
  EXPECT_FALSE(allocator.Find(data, 1).has_value());
}

TEST(SharedAllocatorTest, ForkedChildNamesSegmentsAfterItsOwnPid) {
  std::string parent_name;
  auto a = SharedAllocator::ForThisProcess().Allocate(8, "p");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(absl::StrContains(a->segment->name(), absl::StrCat(".p", getpid(), ".")));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    auto c = SharedAllocator::ForThisProcess().Allocate(8, "c");
    bool own = c.ok() && absl::StrContains(c->segment->name(), absl::StrCat(".p", getpid(), "."));
    char verdict = own ? 'y' : 'n';
    (void)!write(fds[1], &verdict, 1);
    _exit(0);
  }
  char verdict = 0;
  ASSERT_EQ(read(fds[0], &verdict, 1), 1);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(verdict, 'y');
}

TEST(SharedSegmentTest, CreatingAnExistingNameIsResourceExhaustedNamingTheTensor) {
  std::string name = absl::StrCat(TestPrefix(), "dup");
  auto first = SharedSegment::Create(name, 64, "w");
  ASSERT_TRUE(first.ok());
  auto second = SharedSegment::Create(name, 64, "layers.0.w");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "layers.0.w"));
}

}  // namespace
}  // namespace ckpt::client
