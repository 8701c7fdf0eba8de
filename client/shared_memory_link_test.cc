#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory.h"
#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

// A shared-memory file another library made (as PyTorch's share_memory_ does), mapped shared.
struct ForeignFile {
  std::string name;
  size_t size = 0;
  std::byte* data = nullptr;

  ForeignFile(const std::string& n, size_t s) : name(n), size(s) {
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(addr, MAP_FAILED);
    data = static_cast<std::byte*>(addr);
    close(fd);
  }
  ~ForeignFile() {
    munmap(data, size);
    shm_unlink(name.c_str());
  }
};

std::string Prefix() { return absl::StrCat("/ckpt.linktest.p", getpid(), "."); }
std::string Foreign(const char* tag) { return absl::StrCat("/linktest_", getpid(), "_", tag); }

ino_t InodeOf(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST(SharedAllocatorAdoptTest, AdoptedFileIsFoundAndNamedForTheWorkerOnTheSamePages) {
  ForeignFile file(Foreign("a"), 1 << 16);
  std::memset(file.data, 7, file.size);
  SharedAllocator allocator(Prefix());
  auto adopted = allocator.Adopt(file.name, file.data, file.size, "w");
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  const std::string ckpt_name = adopted->segment->name();
  EXPECT_TRUE(absl::StartsWith(ckpt_name, Prefix()));
  EXPECT_EQ(InodeOf(ckpt_name), InodeOf(file.name));  // the worker maps the same memory
  auto found = allocator.Find(file.data + 64, 128);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->offset, 64);
  // Bytes written through a mapping of the ckpt name are the other library's bytes.
  int fd = shm_open(ckpt_name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "x", 1, 100), 1);
  close(fd);
  EXPECT_EQ(file.data[100], std::byte{'x'});
}

TEST(SharedAllocatorAdoptTest, DroppingTheAdoptionUnlinksItsNameButLeavesTheMappingAlone) {
  ForeignFile file(Foreign("b"), 1 << 16);
  SharedAllocator allocator(Prefix());
  std::string ckpt_name;
  {
    auto adopted = allocator.Adopt(file.name, file.data, file.size, "w");
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    ckpt_name = adopted->segment->name();
  }
  EXPECT_EQ(InodeOf(ckpt_name), 0u);
  EXPECT_NE(InodeOf(file.name), 0u);
  file.data[10] = std::byte{3};  // still mapped: the segment did not unmap it
  EXPECT_EQ(file.data[10], std::byte{3});
  EXPECT_FALSE(allocator.Find(file.data, 8).has_value());
}

TEST(SharedAllocatorAdoptTest, RefusesMemoryThatIsNotThatFileMappedSharedAtTheAddress) {
  ForeignFile file(Foreign("c"), 1 << 16);
  ForeignFile other(Foreign("d"), 1 << 16);
  SharedAllocator allocator(Prefix());
  auto wrong_size = allocator.Adopt(file.name, file.data, file.size + 1, "w");
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(wrong_size.status().message(), "tensor w")) << wrong_size.status();
  auto other_address = allocator.Adopt(file.name, other.data, file.size, "w");
  EXPECT_EQ(other_address.status().code(), absl::StatusCode::kFailedPrecondition);
  auto inside = allocator.Adopt(file.name, file.data + 4096, file.size, "w");
  EXPECT_EQ(inside.status().code(), absl::StatusCode::kFailedPrecondition);
  std::string private_memory(1 << 16, '\0');
  auto unmapped = allocator.Adopt(file.name, private_memory.data(), file.size, "w");
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator.Adopt("/no_such_file_linktest", file.data, file.size, "w").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator.Adopt("/../etc/passwd", file.data, file.size, "w").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(allocator.Find(file.data, 8).has_value());
}

}  // namespace
}  // namespace ckpt::client
