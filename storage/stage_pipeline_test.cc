// RunStagePipeline: the next step is produced while the previous one is consumed, a slot is
// never refilled before it was drained (back-pressure), and errors come back in step order.
#include "storage/stage_pipeline.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;

TEST(StagePipelineTest, ProducesTheNextStepWhileThePreviousIsConsumed) {
  absl::Notification second_produced;
  bool overlapped = false;
  auto produce = [&](int64_t step, int) {
    if (step == 1) second_produced.Notify();
    return absl::OkStatus();
  };
  auto consume = [&](int64_t step, int) {
    // Waits (with a deadline) for produce(1): only an overlapping pipeline gets it in time.
    if (step == 0) overlapped = second_produced.WaitForNotificationWithTimeout(absl::Seconds(20));
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunStagePipeline(2, produce, consume).ok());
  EXPECT_TRUE(overlapped);
}

TEST(StagePipelineTest, AlternatesWithoutOverlap) {
  std::vector<std::string> events;
  auto produce = [&](int64_t step, int slot) {
    events.push_back(absl::StrCat("P", step, "/", slot));
    return absl::OkStatus();
  };
  auto consume = [&](int64_t step, int slot) {
    events.push_back(absl::StrCat("C", step, "/", slot));
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunStagePipeline(3, produce, consume, /*overlap=*/false).ok());
  EXPECT_THAT(events, ElementsAre("P0/0", "C0/0", "P1/1", "C1/1", "P2/0", "C2/0"));
}

// Each slot is a "buffer" whose owner is tracked: producing into a slot still being drained,
// or draining a slot before it was filled, is recorded as a violation.
TEST(StagePipelineTest, NeverRefillsASlotBeforeItWasConsumed) {
  constexpr int64_t kSteps = 200;
  std::atomic<int64_t> filled_with[2] = {-1, -1};  // step whose bytes the slot holds
  std::atomic<bool> draining[2] = {false, false};
  absl::Mutex mu;
  std::vector<int64_t> consumed;
  std::vector<std::string> violations;
  auto produce = [&](int64_t step, int slot) {
    if (draining[slot].load()) violations.push_back(absl::StrCat("refilled slot ", slot));
    if (slot != step % 2) violations.push_back(absl::StrCat("step ", step, " in slot ", slot));
    filled_with[slot] = step;
    return absl::OkStatus();
  };
  auto consume = [&](int64_t step, int slot) {
    draining[slot] = true;
    if (filled_with[slot].load() != step) {
      absl::MutexLock l(&mu);
      violations.push_back(absl::StrCat("slot ", slot, " holds ", filled_with[slot].load(),
                                        " when step ", step, " is drained"));
    }
    // Give a too-eager producer time to refill this slot under our feet.
    for (volatile int i = 0; i < 20000; i = i + 1) {
    }
    if (filled_with[slot].load() != step) {
      absl::MutexLock l(&mu);
      violations.push_back(absl::StrCat("slot ", slot, " refilled while step ", step, " drains"));
    }
    draining[slot] = false;
    absl::MutexLock l(&mu);
    consumed.push_back(step);
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunStagePipeline(kSteps, produce, consume).ok());
  EXPECT_THAT(violations, ::testing::IsEmpty());
  ASSERT_EQ(consumed.size(), static_cast<size_t>(kSteps));
  for (int64_t k = 0; k < kSteps; ++k) EXPECT_EQ(consumed[k], k);
}

TEST(StagePipelineTest, AnEarlierConsumeErrorWinsAndNothingRunsAfterIt) {
  std::atomic<int> produced_after{0};
  auto produce = [&](int64_t step, int) {
    if (step >= 2) ++produced_after;
    if (step == 1) return absl::DataLossError("produce 1");
    return absl::OkStatus();
  };
  auto consume = [&](int64_t step, int) {
    if (step == 0) return absl::UnavailableError("consume 0");
    return absl::OkStatus();
  };
  absl::Status s = RunStagePipeline(5, produce, consume);
  EXPECT_EQ(s, absl::UnavailableError("consume 0"));
  EXPECT_EQ(produced_after.load(), 0);
}

TEST(StagePipelineTest, AProduceErrorStopsAfterTheRunningConsume) {
  std::vector<int64_t> consumed;
  absl::Mutex mu;
  auto produce = [&](int64_t step, int) {
    return step == 2 ? absl::NotFoundError("file f") : absl::OkStatus();
  };
  auto consume = [&](int64_t step, int) {
    absl::MutexLock l(&mu);
    consumed.push_back(step);
    return absl::OkStatus();
  };
  EXPECT_EQ(RunStagePipeline(6, produce, consume), absl::NotFoundError("file f"));
  absl::MutexLock l(&mu);
  EXPECT_THAT(consumed, ElementsAre(0, 1));
}

TEST(StagePipelineTest, ZeroStepsRunNothing) {
  int calls = 0;
  auto stage = [&](int64_t, int) {
    ++calls;
    return absl::OkStatus();
  };
  EXPECT_TRUE(RunStagePipeline(0, stage, stage).ok());
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace ckpt
