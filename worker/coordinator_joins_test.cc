#include "worker/coordinator_joins.h"

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kLong = absl::Seconds(10);  // bounds every wait of these tests

pb::JoinOperationRequest JoinOf(int rank) {
  pb::JoinOperationRequest join;
  join.set_job("job");
  join.set_rank(rank);
  return join;
}

// The coordinator's side: answers each join with operation "op-<rank>", except ranks listed
// in `refuse` (InvalidArgument naming the rank); records each call's ranks. The first call
// blocks until `release` when `hold_first` (it signals `first_started`).
struct FakeCoordinator {
  absl::StatusOr<pb::JoinOperationsResponse> operator()(const pb::JoinOperationsRequest& request) {
    {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<int> ranks;
      for (const pb::JoinOperationRequest& j : request.joins()) ranks.push_back(j.rank());
      calls.push_back(ranks);
    }
    if (hold_first && !first_started.HasBeenNotified()) {
      first_started.Notify();
      EXPECT_TRUE(release.WaitForNotificationWithTimeout(kLong));
    }
    if (!fail.ok()) return fail;
    pb::JoinOperationsResponse response;
    for (const pb::JoinOperationRequest& j : request.joins()) {
      pb::JoinResult* result = response.add_results();
      if (j.rank() == refuse) {
        result->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        result->mutable_status()->set_message(absl::StrCat("rank ", j.rank(), " is hostile"));
      } else {
        result->mutable_response()->mutable_operation()->set_id(absl::StrCat("op-", j.rank()));
      }
    }
    if (drop_one) response.mutable_results()->RemoveLast();
    return response;
  }

  bool hold_first = false;
  int refuse = -1;
  bool drop_one = false;
  absl::Status fail;
  absl::Notification first_started, release;
  std::mutex mu;
  std::vector<std::vector<int>> calls;
};

CoordinatorJoins::Call CallOn(FakeCoordinator& fake) {
  return [&fake](const pb::JoinOperationsRequest& r) { return fake(r); };
}

TEST(CoordinatorJoinsTest, AJoinAloneMakesOneCallAndGetsItsAnswer) {
  FakeCoordinator fake;
  CoordinatorJoins joins(CallOn(fake));
  CoordinatorJoins::Result got = joins.Join(JoinOf(3));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->operation().id(), "op-3");
  EXPECT_EQ(joins.calls(), 1);
  EXPECT_EQ(fake.calls, (std::vector<std::vector<int>>{{3}}));
}

TEST(CoordinatorJoinsTest, JoinsArrivingWhileACallIsInFlightGoTogetherInTheNextCall) {
  FakeCoordinator fake;
  fake.hold_first = true;
  std::atomic<int> queued{0};
  absl::Notification all_queued;
  constexpr int kFollowers = 7;
  CoordinatorJoins joins(CallOn(fake), [&] {
    if (++queued == kFollowers) all_queued.Notify();
  });
  std::vector<CoordinatorJoins::Result> got(kFollowers + 1, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = joins.Join(JoinOf(0)); });
  ASSERT_TRUE(fake.first_started.WaitForNotificationWithTimeout(kLong));
  for (int r = 1; r <= kFollowers; ++r) {
    threads.emplace_back([&, r] { got[r] = joins.Join(JoinOf(r)); });
  }
  ASSERT_TRUE(all_queued.WaitForNotificationWithTimeout(kLong));
  fake.release.Notify();
  for (std::thread& t : threads) t.join();
  for (int r = 0; r <= kFollowers; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status();
    EXPECT_EQ(got[r]->operation().id(), absl::StrCat("op-", r));
  }
  ASSERT_EQ(fake.calls.size(), 2u);  // eight ranks, two calls
  EXPECT_EQ(fake.calls[0], std::vector<int>{0});
  EXPECT_EQ(fake.calls[1].size(), static_cast<size_t>(kFollowers));
  EXPECT_EQ(joins.calls(), 2);
}

TEST(CoordinatorJoinsTest, ARefusedJoinGetsItsOwnErrorAndTheOthersTheirAnswers) {
  FakeCoordinator fake;
  fake.hold_first = true;
  fake.refuse = 2;
  absl::Notification both_queued;
  std::atomic<int> queued{0};
  CoordinatorJoins joins(CallOn(fake), [&] {
    if (++queued == 2) both_queued.Notify();
  });
  std::vector<CoordinatorJoins::Result> got(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = joins.Join(JoinOf(0)); });
  ASSERT_TRUE(fake.first_started.WaitForNotificationWithTimeout(kLong));
  threads.emplace_back([&] { got[1] = joins.Join(JoinOf(1)); });
  threads.emplace_back([&] { got[2] = joins.Join(JoinOf(2)); });
  ASSERT_TRUE(both_queued.WaitForNotificationWithTimeout(kLong));
  fake.release.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(got[0].ok());
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[1]->operation().id(), "op-1");
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got[2].status().message(), "rank 2 is hostile");
}

TEST(CoordinatorJoinsTest, AFailedCallFailsEveryJoinItCarriedAndTheNextJoinCallsAgain) {
  FakeCoordinator fake;
  fake.fail = absl::UnavailableError("coordinator gone");
  CoordinatorJoins joins(CallOn(fake));
  EXPECT_EQ(joins.Join(JoinOf(0)).status().code(), absl::StatusCode::kUnavailable);
  fake.fail = absl::OkStatus();
  CoordinatorJoins::Result again = joins.Join(JoinOf(0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(joins.calls(), 2);
}

TEST(CoordinatorJoinsTest, AnAnswerWithTheWrongNumberOfResultsIsAnInternalError) {
  FakeCoordinator fake;
  fake.drop_one = true;
  CoordinatorJoins joins(CallOn(fake));
  CoordinatorJoins::Result got = joins.Join(JoinOf(5));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("0 results to 1 joins"), std::string::npos) << got.status();
}

}  // namespace
}  // namespace ckpt::worker
