#include "common/allocator.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

// This test links @system//:jemalloc, as the coordinator does: malloc is jemalloc's.
TEST(AllocatorTest, ABinaryLinkingJemallocAllocatesWithIt) {
  EXPECT_EQ(AllocatorName().rfind("jemalloc 5.", 0), 0u) << AllocatorName();
  void* block = std::malloc(1 << 20);
  ASSERT_NE(block, nullptr);
  std::free(block);
}

}  // namespace
}  // namespace ckpt
