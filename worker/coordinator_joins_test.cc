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

// No linger; `on_queue` observes joins queueing behind a call.
CoordinatorJoins::Options Observing(CoordinatorJoins::QueueObserver on_queue) {
  CoordinatorJoins::Options options;
  options.on_queue = std::move(on_queue);
  return options;
}

// Calls linger up to `linger` for `peers(job)` joins of each job in the queue.
CoordinatorJoins::Options Lingering(CoordinatorJoins::PeerCount peers, absl::Duration linger,
                                    CoordinatorJoins::QueueObserver on_queue = nullptr) {
  CoordinatorJoins::Options options;
  options.peers = std::move(peers);
  options.linger = linger;
  options.on_queue = std::move(on_queue);
  return options;
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
  CoordinatorJoins joins(CallOn(fake), Observing([&] {
                           if (++queued == kFollowers) all_queued.Notify();
                         }));
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

// Four ranks of the job on this worker: the first join lingers until the other three queued,
// and all four go in one call (ordered by notifications; the linger is only a hang guard).
TEST(CoordinatorJoinsTest, ACallWaitsForEveryRankOfTheJobOnThisWorker) {
  FakeCoordinator fake;
  constexpr int kRanks = 4;
  std::atomic<int> queued{0};
  absl::Notification all_queued;
  CoordinatorJoins joins(CallOn(fake),
                         Lingering([](const std::string&) { return kRanks; }, absl::Minutes(1),
                                   [&] {
                                     if (++queued == kRanks - 1) all_queued.Notify();
                                   }));
  std::vector<CoordinatorJoins::Result> got(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { got[r] = joins.Join(JoinOf(r)); });
  }
  ASSERT_TRUE(all_queued.WaitForNotificationWithTimeout(kLong));
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status();
    EXPECT_EQ(got[r]->operation().id(), absl::StrCat("op-", r));
  }
  ASSERT_EQ(fake.calls.size(), 1u) << "four ranks, one call";
  EXPECT_EQ(fake.calls[0].size(), static_cast<size_t>(kRanks));
}

// Two ranks of the job on this worker, but only one joins: its call goes once the linger
// passed, alone, and the next join lingers again.
TEST(CoordinatorJoinsTest, ARankThatNeverJoinsDelaysTheCallByTheLingerAtMost) {
  FakeCoordinator fake;
  CoordinatorJoins joins(CallOn(fake),
                         Lingering([](const std::string&) { return 2; }, absl::Milliseconds(5)));
  CoordinatorJoins::Result got = joins.Join(JoinOf(0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->operation().id(), "op-0");
  ASSERT_TRUE(joins.Join(JoinOf(0)).ok());
  EXPECT_EQ(fake.calls, (std::vector<std::vector<int>>{{0}, {0}}));
}

// Joins of another job do not count as this job's peers: job "job" has two ranks here,
// "other" one. Rank 0 of "job" lingers alone; "other"'s join arrives and the leader lingers on
// (had it counted the other job's join, it would have called); rank 2 of "job" completes the
// call, which carries all three.
TEST(CoordinatorJoinsTest, OnlyTheJobsOwnJoinsCountAsItsPeers) {
  FakeCoordinator fake;
  absl::Notification lingering_alone, lingering_with_other;
  CoordinatorJoins::Options options =
      Lingering([](const std::string& job) { return job == "job" ? 2 : 1; }, absl::Minutes(1));
  options.on_linger = [&](int queued) {
    if (queued == 1 && !lingering_alone.HasBeenNotified()) lingering_alone.Notify();
    if (queued == 2 && !lingering_with_other.HasBeenNotified()) lingering_with_other.Notify();
  };
  CoordinatorJoins joins(CallOn(fake), std::move(options));
  std::vector<CoordinatorJoins::Result> got(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = joins.Join(JoinOf(0)); });
  ASSERT_TRUE(lingering_alone.WaitForNotificationWithTimeout(kLong));
  threads.emplace_back([&] {
    pb::JoinOperationRequest other = JoinOf(1);
    other.set_job("other");
    got[1] = joins.Join(other);
  });
  EXPECT_TRUE(lingering_with_other.WaitForNotificationWithTimeout(kLong))
      << "the other job's join was counted as a peer";
  threads.emplace_back([&] { got[2] = joins.Join(JoinOf(2)); });
  for (std::thread& t : threads) t.join();
  for (const CoordinatorJoins::Result& r : got) EXPECT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(fake.calls.size(), 1u);
  EXPECT_EQ(fake.calls[0].size(), 3u);
}

TEST(CoordinatorJoinsTest, ARefusedJoinGetsItsOwnErrorAndTheOthersTheirAnswers) {
  FakeCoordinator fake;
  fake.hold_first = true;
  fake.refuse = 2;
  absl::Notification both_queued;
  std::atomic<int> queued{0};
  CoordinatorJoins joins(CallOn(fake), Observing([&] {
                           if (++queued == 2) both_queued.Notify();
                         }));
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
