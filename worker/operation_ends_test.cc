#include "worker/operation_ends.h"

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kLong = absl::Seconds(30);  // bounds every wait of these tests
using Outcome = OperationEnds::Outcome;

pb::OperationStatus Done(const std::string& id) {
  pb::OperationStatus op;
  op.set_id(id);
  op.set_phase(pb::PHASE_DONE);
  op.set_bytes_done(42);
  return op;
}

TEST(OperationEndsTest, WithNoStreamOpenAWaitIsNotWatchedAtOnce) {
  OperationEnds ends;
  ends.Joined("op", ends.OpenStream());  // 0: nothing recorded
  pb::OperationStatus status;
  EXPECT_EQ(ends.Wait("op", absl::InfiniteFuture(), &status), Outcome::kNotWatched);
  EXPECT_FALSE(ends.KnownOngoing("op"));
}

TEST(OperationEndsTest, AJoinUnderTheOpenStreamWaitsForTheEndItBrings) {
  OperationEnds ends;
  ends.StreamOpened();
  ends.Joined("op", ends.OpenStream());
  EXPECT_TRUE(ends.KnownOngoing("op"));
  EXPECT_FALSE(ends.KnownOngoing("other"));
  pb::OperationStatus status;
  Outcome outcome = Outcome::kNotWatched;
  std::thread waiter([&] { outcome = ends.Wait("op", absl::Now() + kLong, &status); });
  ends.Ended(Done("op"));
  waiter.join();
  EXPECT_EQ(outcome, Outcome::kEnded);
  EXPECT_EQ(status.phase(), pb::PHASE_DONE);
  EXPECT_EQ(status.bytes_done(), 42);
  EXPECT_FALSE(ends.KnownOngoing("op"));
}

TEST(OperationEndsTest, TheStreamClosingSendsItsWaitersToTheCoordinator) {
  OperationEnds ends;
  ends.StreamOpened();
  ends.Joined("op", ends.OpenStream());
  pb::OperationStatus status;
  Outcome outcome = Outcome::kEnded;
  std::thread waiter([&] { outcome = ends.Wait("op", absl::Now() + kLong, &status); });
  ends.StreamClosed();
  waiter.join();
  EXPECT_EQ(outcome, Outcome::kNotWatched);
}

TEST(OperationEndsTest, AJoinUnderAnEarlierStreamIsNotWatchedByALaterOne) {
  OperationEnds ends;
  ends.StreamOpened();
  const uint64_t first = ends.OpenStream();
  ends.Joined("op", first);
  ends.StreamClosed();
  ends.StreamOpened();
  EXPECT_NE(ends.OpenStream(), first);
  EXPECT_FALSE(ends.KnownOngoing("op"));  // its end may have come while no stream was open
  pb::OperationStatus status;
  EXPECT_EQ(ends.Wait("op", absl::Now() + kLong, &status), Outcome::kNotWatched);
  ends.Joined("op", ends.OpenStream());  // another rank joined under the new stream
  EXPECT_TRUE(ends.KnownOngoing("op"));
}

TEST(OperationEndsTest, AWatchedOperationNotEndedByTheDeadlineSaysSo) {
  OperationEnds ends;
  ends.StreamOpened();
  ends.Joined("op", ends.OpenStream());
  pb::OperationStatus status;
  EXPECT_EQ(ends.Wait("op", absl::Now(), &status), Outcome::kNotEndedBy);
}

TEST(OperationEndsTest, AKnownEndIsAnsweredWithNoStreamOpen) {
  OperationEnds ends;
  ends.StreamOpened();
  ends.Joined("op", ends.OpenStream());
  ends.Ended(Done("op"));
  ends.StreamClosed();
  pb::OperationStatus status;
  EXPECT_EQ(ends.Wait("op", absl::InfiniteFuture(), &status), Outcome::kEnded);
  EXPECT_EQ(status.id(), "op");
}

TEST(OperationEndsTest, OnlyTheNewestOperationsAreRemembered) {
  OperationEnds ends;
  ends.StreamOpened();
  for (size_t i = 0; i <= OperationEnds::kRemembered; ++i) {
    const std::string id = absl::StrCat("op", i);
    ends.Joined(id, ends.OpenStream());
    ends.Ended(Done(id));
  }
  pb::OperationStatus status;
  EXPECT_EQ(ends.Wait("op0", absl::Now(), &status), Outcome::kNotWatched);  // forgotten
  EXPECT_EQ(ends.Wait(absl::StrCat("op", OperationEnds::kRemembered), absl::Now(), &status),
            Outcome::kEnded);
}

}  // namespace
}  // namespace ckpt::worker
