#include "worker/host_buffer_pool.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/page_faults.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;

// Under ThreadSanitizer a page-fault count measures the sanitizer, not the pool
// (common/page_faults.h).
constexpr bool kFaultsMeasureThePool = kPageFaultsMeasureTheCode;

int64_t MinorFaults() { return ThreadMinorFaults(); }

TEST(HostBufferPoolTest, ChunksAreAlignedForODirectAndSizedInWholeBlocks) {
  HostBufferPool pool(4 * kChunk, kChunk + 1);
  EXPECT_EQ(pool.chunk_bytes() % 4096, 0);
  absl::StatusOr<HostBufferPool::Chunk> c = pool.Acquire(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c->data()) % 4096, 0u);
  EXPECT_EQ(c->size(), pool.chunk_bytes());
}

TEST(HostBufferPoolTest, AChunkReturnedIsReusedWithoutMappingOrFaultingInNewMemory) {
  HostBufferPool pool(4 * kChunk, kChunk);
  {
    absl::StatusOr<HostBufferPool::Chunk> first = pool.Acquire(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(first.ok());
    std::fill_n(first->data(), kChunk, 'a');
  }
  EXPECT_EQ(pool.stats().bytes_mapped, kChunk);
  const int64_t faults_before = MinorFaults();
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<HostBufferPool::Chunk> again = pool.Acquire(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(again.ok());
    std::fill_n(again->data(), kChunk, static_cast<char>('b' + i));
  }
  // 10 MiB written: fresh memory would fault in 2560 pages (or 5 huge pages); the pool none.
  if (kFaultsMeasureThePool) {
    EXPECT_LT(MinorFaults() - faults_before, 5);
  }
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.chunks_mapped, 1);
  EXPECT_EQ(stats.bytes_mapped, kChunk);
  EXPECT_EQ(stats.reuses, 10);
  EXPECT_EQ(stats.chunks_in_use, 0);
}

TEST(HostBufferPoolTest, PrefaultMapsTheWholeBoundSoTheFirstUseFaultsNothing) {
  HostBufferPool pool(3 * kChunk, kChunk);
  ASSERT_TRUE(pool.Prefault().ok());
  EXPECT_EQ(pool.stats().bytes_mapped, 3 * kChunk);
  const int64_t faults_before = MinorFaults();
  std::vector<HostBufferPool::Chunk> chunks;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HostBufferPool::Chunk> c = pool.Acquire(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(c.ok());
    std::fill_n(c->data(), kChunk, 'z');
    chunks.push_back(*std::move(c));
  }
  if (kFaultsMeasureThePool) {
    EXPECT_LT(MinorFaults() - faults_before, 5);
  }
  EXPECT_EQ(pool.stats().chunks_mapped, 3);
}

TEST(HostBufferPoolTest, AFullPoolNeverGrowsPastItsBoundAndTimesOutAtTheDeadline) {
  HostBufferPool pool(2 * kChunk, kChunk);
  absl::StatusOr<HostBufferPool::Chunk> a = pool.Acquire(absl::Now() + absl::Seconds(5));
  absl::StatusOr<HostBufferPool::Chunk> b = pool.Acquire(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<HostBufferPool::Chunk> c = pool.Acquire(absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(pool.stats().chunks_mapped, 2);
  EXPECT_EQ(pool.stats().waits, 1);
}

TEST(HostBufferPoolTest, AFullPoolHandsTheNextChunkOutOnceOneIsReturned) {
  HostBufferPool pool(kChunk, kChunk);
  absl::StatusOr<HostBufferPool::Chunk> held = pool.Acquire(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  char* const data = held->data();
  absl::Notification waiting_started;
  absl::StatusOr<HostBufferPool::Chunk> next = absl::UnknownError("not yet");
  std::thread waiter([&] {
    waiting_started.Notify();
    next = pool.Acquire(absl::Now() + absl::Seconds(30));
  });
  waiting_started.WaitForNotification();
  held->Reset();  // returned: the waiter gets it (whether or not it is waiting yet)
  waiter.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->data(), data);
  EXPECT_EQ(pool.stats().chunks_mapped, 1);
}

}  // namespace
}  // namespace ckpt::worker
