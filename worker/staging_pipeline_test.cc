// The staging pipeline on the host copy engine: ordering, overlap, budget, the drained signal
// and errors. The same pipeline runs over CudaCopyEngine in the daemon.
#include "worker/staging_pipeline.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "device/host_memcpy_copy_engine_for_tests.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kChunk = 8192;
const absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

std::string Bytes(int seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 131 + i * 7 + i / 251) & 0xff);
  return s;
}

// "Device" tensors (host memory for the test engine) and their staged copies.
struct Tensors {
  std::vector<std::string> device;
  std::vector<std::string> staged;
  std::vector<DeviceRange> ranges;
  explicit Tensors(const std::vector<size_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      device.push_back(Bytes(static_cast<int>(i) + 1, sizes[i]));
      staged.push_back(std::string(sizes[i], '\0'));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      ranges.push_back(
          DeviceRange{"t" + std::to_string(i), device[i].data(), static_cast<int64_t>(sizes[i])});
    }
  }
  std::function<absl::Status(const StagedChunk&)> Consumer(std::vector<StagedChunk>* order) {
    return [this, order](const StagedChunk& c) {
      std::memcpy(staged[c.range].data() + c.offset, c.host, c.bytes);
      if (order != nullptr) order->push_back(c);
      return absl::OkStatus();
    };
  }
};

TEST(StagingPipelineTest, StagesEveryByteInOrderThroughFewerBuffersThanChunks) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 3 * kChunk, kChunk);
  Tensors t({5 * kChunk + 17, 0, kChunk, 3});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::vector<StagedChunk> order;
  StagingStats stats;
  ASSERT_TRUE(StageDeviceToHost(*lease, t.ranges, "rank 0 of job j", nullptr, t.Consumer(&order),
                                nullptr, Deadline(), &stats)
                  .ok());
  EXPECT_EQ(t.staged, t.device);
  ASSERT_EQ(order.size(), 8u);  // 6 + 0 + 1 + 1
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_TRUE(order[i - 1].range < order[i].range ||
                (order[i - 1].range == order[i].range && order[i - 1].offset < order[i].offset));
  }
  EXPECT_EQ(stats.chunks, 8);
  EXPECT_EQ(stats.bytes, 6 * kChunk + 17 + 3);
  EXPECT_TRUE(stats.over_budget);
}

TEST(StagingPipelineTest, CopiesTheNextChunkWhileTheCurrentOneIsConsumed) {
  HostMemcpyCopyEngineForTests engine;
  absl::Notification second_copy_ran;
  std::atomic<int> copies{0};
  engine.set_hook([&](const HostCopy&) {
    if (++copies == 2) second_copy_ran.Notify();
    return absl::OkStatus();
  });
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  Tensors t({4 * kChunk});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  bool overlapped = false;
  auto consume = t.Consumer(nullptr);
  absl::Status s = StageDeviceToHost(
      *lease, t.ranges, "rank 0 of job j", nullptr,
      [&](const StagedChunk& c) {
        // Chunk 1 must be copied while chunk 0 is being consumed (written and hashed).
        if (c.offset == 0)
          overlapped = second_copy_ran.WaitForNotificationWithTimeout(absl::Seconds(20));
        return consume(c);
      },
      nullptr, Deadline(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(t.staged, t.device);
}

TEST(StagingPipelineTest, DrainedSignalComesAfterTheLastDeviceByteAndBeforeTheWrites) {
  HostMemcpyCopyEngineForTests engine;
  std::atomic<int> copied{0};
  engine.set_hook([&](const HostCopy&) {
    ++copied;
    return absl::OkStatus();
  });
  PinnedStagingPool pool(&engine, 8 * kChunk, kChunk);  // the whole state fits
  Tensors t({3 * kChunk, kChunk + 5});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  std::vector<StagedChunk> consumed;
  int copied_at_signal = -1;
  size_t consumed_at_signal = 99;
  StagingStats stats;
  ASSERT_TRUE(StageDeviceToHost(
                  *lease, t.ranges, "rank 0 of job j", nullptr, t.Consumer(&consumed),
                  [&] {
                    copied_at_signal = copied.load();
                    consumed_at_signal = consumed.size();
                  },
                  Deadline(), &stats)
                  .ok());
  EXPECT_EQ(copied_at_signal, 5);     // every chunk had left the "device"
  EXPECT_EQ(consumed_at_signal, 0u);  // before anything was written
  EXPECT_FALSE(stats.over_budget);
  EXPECT_EQ(stats.bytes_consumed_before_drained, 0);
  EXPECT_EQ(t.staged, t.device);
}

TEST(StagingPipelineTest, AStateLargerThanTheBudgetSignalsDrainedOnlyAfterBuffersWereReused) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  Tensors t({7 * kChunk});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  std::vector<StagedChunk> consumed;
  size_t consumed_at_signal = 0;
  StagingStats stats;
  ASSERT_TRUE(StageDeviceToHost(
                  *lease, t.ranges, "rank 0 of job j", nullptr, t.Consumer(&consumed),
                  [&] { consumed_at_signal = consumed.size(); }, Deadline(), &stats)
                  .ok());
  EXPECT_EQ(consumed_at_signal, 5u);  // 7 chunks through 2 buffers: 5 consumed first
  EXPECT_TRUE(stats.over_budget);
  EXPECT_EQ(stats.bytes_consumed_before_drained, 5 * kChunk);
  EXPECT_EQ(t.staged, t.device);
}

TEST(StagingPipelineTest, PinnedBuffersAreAllocatedOnceAndReusedAcrossSaves) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 4 * kChunk, kChunk);
  for (int save = 0; save < 3; ++save) {
    Tensors t({static_cast<size_t>(9 * kChunk + save)});
    auto lease = pool.Acquire(Deadline());
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(StageDeviceToHost(*lease, t.ranges, "rank 0 of job j", nullptr, t.Consumer(nullptr),
                                  nullptr, Deadline(), nullptr)
                    .ok());
    EXPECT_EQ(t.staged, t.device);
  }
  EXPECT_EQ(engine.pinned_allocations(), 4);
  EXPECT_EQ(engine.pinned_bytes_live(), 4 * kChunk);  // never more than the budget
}

TEST(StagingPipelineTest, ABudgetSmallerThanTwoChunksUsesTwoSmallerBuffers) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 3 * kChunk, 8 * kChunk);
  EXPECT_EQ(pool.num_buffers(), 2);
  EXPECT_LE(pool.capacity_bytes(), 3 * kChunk);
  PinnedStagingPool tiny(&engine, 100, kChunk);
  EXPECT_EQ(tiny.Acquire(Deadline()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagingPipelineTest, AFailedPinnedAllocationIsReportedAndRetriedNextTime) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  engine.FailNextAllocation();
  auto failed = pool.Acquire(Deadline());
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(failed.status().message().find("pinned staging on host memcpy (tests)"),
            std::string::npos)
      << failed.status();
  EXPECT_TRUE(pool.Acquire(Deadline()).ok());
}

TEST(StagingPipelineTest, ACopyErrorNamesTheTensorTheRankAndTheBytes) {
  HostMemcpyCopyEngineForTests engine;
  Tensors t({2 * kChunk, 2 * kChunk});
  const void* bad = static_cast<const char*>(t.ranges[1].device) + kChunk;
  engine.set_hook([&](const HostCopy& c) {
    return c.src == bad ? absl::InternalError("CUDA cudaErrorIllegalAddress: injected")
                        : absl::OkStatus();
  });
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  bool drained = false;
  absl::Status s = StageDeviceToHost(
      *lease, t.ranges, "rank 3 of job j", nullptr, t.Consumer(nullptr), [&] { drained = true; },
      Deadline(), nullptr);
  ASSERT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("rank 3 of job j: tensor t1 bytes [8192, 16384)"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("cudaErrorIllegalAddress"), std::string::npos) << s;
  EXPECT_FALSE(drained);  // the trainer must not be told its bytes are out
}

TEST(StagingPipelineTest, AStopBetweenChunksEndsTheStagingWithItsReason) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  Tensors t({6 * kChunk});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  int asked = 0;
  absl::Status s = StageDeviceToHost(
      *lease, t.ranges, "rank 1 of job j",
      [&] { return ++asked > 3 ? absl::AbortedError("operation aborted") : absl::OkStatus(); },
      t.Consumer(nullptr), nullptr, Deadline(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("tensor t0"), std::string::npos) << s;
}

TEST(StagingPipelineTest, AConsumerErrorNamesTheTensor) {
  HostMemcpyCopyEngineForTests engine;
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  Tensors t({kChunk, kChunk});
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  absl::Status s = StageDeviceToHost(
      *lease, t.ranges, "rank 0 of job j", nullptr,
      [](const StagedChunk& c) {
        return c.range == 1 ? absl::DataLossError("disk full") : absl::OkStatus();
      },
      nullptr, Deadline(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor t1"), std::string::npos) << s;
}

TEST(StagingPipelineTest, HostToDeviceFillsTheNextChunkWhileTheCurrentOneIsCopied) {
  HostMemcpyCopyEngineForTests engine;
  absl::Notification second_produced;
  std::atomic<bool> overlapped{false};
  engine.set_hook([&](const HostCopy& c) {
    // The first copy waits until the producer has filled the next chunk.
    if (c.ticket == 1)
      overlapped = second_produced.WaitForNotificationWithTimeout(absl::Seconds(20));
    return absl::OkStatus();
  });
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  std::vector<std::string> source = {Bytes(9, 3 * kChunk + 100)};
  std::vector<std::string> device = {std::string(source[0].size(), '\0')};
  std::vector<DeviceRange> ranges = {
      {"w", device[0].data(), static_cast<int64_t>(device[0].size())}};
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  std::vector<ChunkSpec> chunks = CutIntoChunks(ranges, kChunk);
  int produced = 0;
  absl::Status s = StageHostToDevice(
      *lease, ranges, chunks, "rank 0 of job j", nullptr,
      [&](const StagedChunk& c) {
        std::memcpy(c.host, source[c.range].data() + c.offset, c.bytes);
        if (++produced == 2) second_produced.Notify();
        return absl::OkStatus();
      },
      Deadline(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(device, source);
}

TEST(StagingPipelineTest, HostToDeviceErrorsNameTheTensorAndWaitForCopiesInFlight) {
  HostMemcpyCopyEngineForTests engine;
  std::atomic<int> copies{0};
  engine.set_hook([&](const HostCopy&) {
    ++copies;
    return absl::OkStatus();
  });
  PinnedStagingPool pool(&engine, 2 * kChunk, kChunk);
  std::vector<std::string> device = {std::string(4 * kChunk, '\0')};
  std::vector<DeviceRange> ranges = {{"opt.m", device[0].data(), 4 * kChunk}};
  auto lease = pool.Acquire(Deadline());
  ASSERT_TRUE(lease.ok());
  absl::Status s = StageHostToDevice(
      *lease, ranges, CutIntoChunks(ranges, kChunk), "rank 2 of job j", nullptr,
      [&](const StagedChunk& c) {
        return c.offset == 2 * kChunk ? absl::DataLossError("checksum mismatch") : absl::OkStatus();
      },
      Deadline(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("rank 2 of job j: tensor opt.m bytes [16384, 24576)"),
            std::string::npos)
      << s;
  EXPECT_EQ(copies.load(), 2);  // both copies issued before the error completed
}

}  // namespace
}  // namespace ckpt::worker
