#include "worker/memory_gate.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

TEST(MemoryGateTest, CopiesMatchAPlainCopyAcrossChunkBoundaries) {
  MemoryGate gate;
  const size_t n = 2 * MemoryGate::kChunkBytes + 12345;
  std::vector<char> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE(gate.Copy(dst.data(), src.data(), n).ok());
  EXPECT_EQ(dst, src);

  // Runs: long ones split across chunks and short ones batched give ckpt::CopyRuns' result.
  std::mt19937_64 rng(5);
  const int64_t elem = 4, elements = static_cast<int64_t>(n) / elem;
  std::vector<CopyRun> runs;
  for (int64_t at = 0; at < elements;) {
    int64_t len = std::min<int64_t>(elements - at, rng() % 3 == 0 ? 3000000 : rng() % 50 + 1);
    runs.push_back(CopyRun{at, elements - at - len, len});  // reversed placement
    at += len;
  }
  std::vector<char> want(n, 0), got(n, 0);
  CopyRuns(runs, elem, src.data(), want.data());
  ASSERT_TRUE(gate.CopyRuns(runs, elem, src.data(), got.data()).ok());
  EXPECT_EQ(got, want);
}

TEST(MemoryGateTest, CloseWaitsForTheAccessInProgressAndRefusesLaterOnes) {
  MemoryGate gate;
  std::atomic<bool> close_returned{false};
  absl::Notification entered;
  std::thread closer;
  absl::Status during = gate.Run([&] {
    entered.Notify();
    closer = std::thread([&] {
      gate.Close(absl::UnavailableError("the worker of rank 1 missed its lease"));
      close_returned = true;
    });
    // The reason is set as soon as Close starts; Close itself must wait for this access.
    while (!gate.closed()) std::this_thread::yield();
    EXPECT_FALSE(close_returned.load());
    return absl::OkStatus();
  });
  closer.join();
  EXPECT_TRUE(during.ok());
  EXPECT_TRUE(close_returned.load());
  bool ran = false;
  absl::Status after = gate.Run([&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(ran);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(after.message(), ::testing::HasSubstr("missed its lease"));
  // The first reason stays.
  gate.Close(absl::CancelledError("later"));
  EXPECT_EQ(gate.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MemoryGateTest, AFailedPreconditionClosesTheGateBetweenChunks) {
  int entries = 0;
  MemoryGate gate([&] {
    return ++entries == 1 ? absl::OkStatus()
                          : absl::UnavailableError("this worker's lease ran out");
  });
  const size_t n = 3 * MemoryGate::kChunkBytes;
  std::vector<char> src(n, 1), dst(n, 0);
  absl::Status s = gate.Copy(dst.data(), src.data(), n);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(dst[0], 1);                        // the first chunk was copied
  EXPECT_EQ(dst[MemoryGate::kChunkBytes], 0);  // the second was not
  EXPECT_EQ(gate.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ckpt::worker
