#include "worker/coordinator_waits.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kLong = absl::Seconds(10);  // bounds every wait of these tests

pb::OperationStatus Phase(pb::OperationPhase phase) {
  pb::OperationStatus op;
  op.set_phase(phase);
  return op;
}

// A call that signals it started, then blocks until released, then returns `result`.
struct BlockingCall {
  explicit BlockingCall(CoordinatorWaits::Result r) : result(std::move(r)) {}
  CoordinatorWaits::Result operator()() {
    started.Notify();
    EXPECT_TRUE(release.WaitForNotificationWithTimeout(kLong));
    return result;
  }
  CoordinatorWaits::Result result;
  absl::Notification started, release;
};

// Notified once `n` waits joined a call in flight (the helper's join observer).
struct Joins {
  explicit Joins(int n) : left(n) {}
  void Joined() {
    if (left.fetch_sub(1) == 1) all.Notify();
  }
  std::atomic<int> left;
  absl::Notification all;
};

CoordinatorWaits::Call Unexpected() {
  return [] {
    ADD_FAILURE() << "a follower made its own call";
    return CoordinatorWaits::Result(absl::InternalError("unexpected"));
  };
}

// One leader making `call` on "op/1" and `followers` waits that join it; returns every
// waiter's result (the leader's first) once `call` is released.
std::vector<std::optional<CoordinatorWaits::Result>> LeaderAndFollowers(BlockingCall& call,
                                                                        int followers) {
  Joins joins(followers);
  CoordinatorWaits waits([&](const std::string&) { joins.Joined(); });
  std::vector<std::optional<CoordinatorWaits::Result>> got(followers + 1);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = waits.Wait("op/1", absl::Now() + kLong, std::ref(call)); });
  EXPECT_TRUE(call.started.WaitForNotificationWithTimeout(kLong));
  for (int i = 1; i <= followers; ++i) {
    threads.emplace_back(
        [&, i] { got[i] = waits.Wait("op/1", absl::Now() + kLong, Unexpected()); });
  }
  EXPECT_TRUE(joins.all.WaitForNotificationWithTimeout(kLong));
  call.release.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(waits.calls(), 1);
  EXPECT_EQ(waits.joins(), followers);
  return got;
}

TEST(CoordinatorWaitsTest, ThreadsWaitingOnOneKeyMakeOneCallAndAllGetItsResult) {
  BlockingCall call(Phase(pb::PHASE_DONE));
  for (const auto& r : LeaderAndFollowers(call, /*followers=*/7)) {
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->ok());
    EXPECT_EQ((*r)->phase(), pb::PHASE_DONE);
  }
}

TEST(CoordinatorWaitsTest, DifferentKeysMakeSeparateCalls) {
  CoordinatorWaits waits;
  BlockingCall call(Phase(pb::PHASE_DONE));
  std::thread leader([&] { waits.Wait("op/1", absl::Now() + kLong, std::ref(call)); });
  ASSERT_TRUE(call.started.WaitForNotificationWithTimeout(kLong));
  bool own_call = false;
  auto other = waits.Wait("op/2", absl::Now() + kLong, [&] {
    own_call = true;
    return CoordinatorWaits::Result(Phase(pb::PHASE_ABORTED));
  });
  call.release.Notify();
  leader.join();
  EXPECT_TRUE(own_call);
  ASSERT_TRUE(other.has_value() && other->ok());
  EXPECT_EQ((*other)->phase(), pb::PHASE_ABORTED);
  EXPECT_EQ(waits.calls(), 2);
}

TEST(CoordinatorWaitsTest, FollowerWithShortDeadlineReturnsAtItsDeadline) {
  CoordinatorWaits waits;
  BlockingCall call(Phase(pb::PHASE_DONE));
  std::optional<CoordinatorWaits::Result> leader_got;
  std::thread leader([&] { leader_got = waits.Wait("op/1", absl::Now() + kLong, std::ref(call)); });
  ASSERT_TRUE(call.started.WaitForNotificationWithTimeout(kLong));
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  auto follower = waits.Wait("op/1", deadline, Unexpected());
  EXPECT_FALSE(follower.has_value());
  EXPECT_GE(absl::Now(), deadline);
  EXPECT_FALSE(call.release.HasBeenNotified());  // it did not wait for the shared call
  call.release.Notify();
  leader.join();
  ASSERT_TRUE(leader_got.has_value() && leader_got->ok());
  EXPECT_EQ(waits.calls(), 1);
}

TEST(CoordinatorWaitsTest, AnErrorOfTheSharedCallReachesEveryWaiter) {
  BlockingCall call(absl::UnavailableError("coordinator restarting"));
  for (const auto& r : LeaderAndFollowers(call, /*followers=*/3)) {
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(r->status().message(), "coordinator restarting");
  }
}

TEST(CoordinatorWaitsTest, AWaitAfterTheCallReturnedMakesANewCall) {
  CoordinatorWaits waits;
  int calls = 0;
  auto call = [&] {
    ++calls;
    return CoordinatorWaits::Result(Phase(calls == 1 ? pb::PHASE_EXECUTING : pb::PHASE_DONE));
  };
  auto first = waits.Wait("op/1", absl::Now() + kLong, call);
  auto second = waits.Wait("op/1", absl::Now() + kLong, call);
  ASSERT_TRUE(first.has_value() && first->ok() && second.has_value() && second->ok());
  EXPECT_EQ((*first)->phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ((*second)->phase(), pb::PHASE_DONE);
  EXPECT_EQ(waits.calls(), 2);
  EXPECT_EQ(waits.joins(), 0);
}

}  // namespace
}  // namespace ckpt::worker
