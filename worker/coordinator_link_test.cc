// CoordinatorLink against a coordinator peer that is a real gRPC service on loopback
// (worker/fake_coordinator.h): registration, the work stream, and re-registration when the
// coordinator goes away and a new incarnation takes its address.
#include "worker/coordinator_link.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "worker/fake_coordinator.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// What the link's handlers saw, with waits on it.
struct Observed {
  absl::Mutex mu;
  std::vector<std::string> registered_ids ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> lost ABSL_GUARDED_BY(mu);
  std::vector<pb::WorkItem> items ABSL_GUARDED_BY(mu);

  bool WaitFor(const std::function<bool()>& done) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&done, &std::function<bool()>::operator()), kWait);
  }
};

LinkOptions OptionsFor(const std::string& address) {
  LinkOptions options;
  options.coordinator = address;
  options.info.set_host("linkhost");
  options.rpc_timeout = absl::Seconds(2);
  return options;
}

void Observe(CoordinatorLink& link, Observed& seen) {
  link.SetRegisteredHandler([&seen](const std::string& id) {
    absl::MutexLock lock(&seen.mu);
    seen.registered_ids.push_back(id);
  });
  link.SetLeaseLostHandler([&seen](const absl::Status& why) {
    absl::MutexLock lock(&seen.mu);
    seen.lost.push_back(why);
  });
  link.SetWorkHandler([&seen](const pb::WorkItem& item) {
    absl::MutexLock lock(&seen.mu);
    seen.items.push_back(item);
  });
}

pb::WorkItem Item(const std::string& operation_id) {
  pb::WorkItem item;
  item.set_operation_id(operation_id);
  item.set_plan_part("part");
  return item;
}

TEST(CoordinatorLinkTest, RegistersAndHandsEveryStreamedWorkItemToItsHandlerInOrder) {
  FakeCoordinator coordinator(/*incarnation=*/7);
  ASSERT_NE(coordinator.Start(), 0);
  CoordinatorLink link(OptionsFor(coordinator.address()));
  Observed seen;
  Observe(link, seen);
  link.Start();
  ASSERT_TRUE(link.WaitRegistered(kWait).ok());
  EXPECT_EQ(link.incarnation(), 7u);
  EXPECT_EQ(link.registration_epoch(), 1u);
  EXPECT_TRUE(link.LeaseStatus(1).ok());
  coordinator.Push(Item("op-a"));
  coordinator.Push(Item("op-b"));
  ASSERT_TRUE(
      seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return seen.items.size() == 2; }));
  // The registered handler runs on the link's thread once the registration is in place.
  ASSERT_TRUE(
      seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !seen.registered_ids.empty(); }));
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.items[0].operation_id(), "op-a");
    EXPECT_EQ(seen.items[1].operation_id(), "op-b");
    EXPECT_EQ(seen.registered_ids, std::vector<std::string>{link.worker_id()});
  }
  // Items batched in one message are handed on one by one, in order.
  pb::WorkItem message = Item("op-c");
  *message.add_batched() = Item("op-d");
  *message.add_batched() = Item("op-e");
  coordinator.Push(message);
  ASSERT_TRUE(
      seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return seen.items.size() == 5; }));
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.items[2].operation_id(), "op-c");
    EXPECT_EQ(seen.items[2].batched_size(), 0);
    EXPECT_EQ(seen.items[3].operation_id(), "op-d");
    EXPECT_EQ(seen.items[4].operation_id(), "op-e");
  }
  link.Stop(/*deregister=*/false);
}

TEST(CoordinatorLinkTest, RegistersWithTheNewIncarnationAfterTheCoordinatorRestartsOnItsAddress) {
  auto first = std::make_unique<FakeCoordinator>(/*incarnation=*/1);
  const int port = first->Start();
  ASSERT_NE(port, 0);
  CoordinatorLink link(OptionsFor(first->address()));
  Observed seen;
  Observe(link, seen);
  link.Start();
  ASSERT_TRUE(link.WaitRegistered(kWait).ok());
  const std::string first_id = link.worker_id();
  ASSERT_TRUE(first->WaitForWatchers(1, kWait));

  // The coordinator goes away; a new process (another incarnation, which knows no worker) takes
  // its address.
  first->Stop();
  first.reset();
  FakeCoordinator second(/*incarnation=*/2);
  ASSERT_EQ(second.Start(port), port);

  ASSERT_TRUE(second.WaitForRegistrations(1, kWait));
  ASSERT_TRUE(seen.WaitFor(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return seen.registered_ids.size() == 2; }));
  ASSERT_TRUE(link.WaitRegistered(kWait).ok());
  EXPECT_EQ(link.incarnation(), 2u);
  EXPECT_NE(link.worker_id(), first_id);
  EXPECT_EQ(link.worker_id(), second.registered_ids()[0]);
  // The old registration is reported lost (once) to the lease-lost handler.
  ASSERT_TRUE(seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !seen.lost.empty(); }));
  {
    absl::MutexLock lock(&seen.mu);
    ASSERT_EQ(seen.lost.size(), 1u);
    EXPECT_TRUE(absl::StrContains(seen.lost[0].ToString(), "unknown worker") ||
                absl::StrContains(seen.lost[0].ToString(), "incarnation"))
        << seen.lost[0];
  }
  // Operations that ran under the old registration must no longer touch trainer memory.
  EXPECT_EQ(link.registration_epoch(), 2u);
  EXPECT_EQ(link.LeaseStatus(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(link.LeaseStatus(2).ok());

  // Work of the new coordinator reaches the handler over the re-established stream.
  second.Push(Item("op-after-restart"));
  ASSERT_TRUE(seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !seen.items.empty() && seen.items.back().operation_id() == "op-after-restart";
  }));
  link.Stop(/*deregister=*/false);
}

TEST(CoordinatorLinkTest, WorkFromAnotherIncarnationIsNotHandedOnAndMakesItRegisterAgain) {
  FakeCoordinator coordinator(/*incarnation=*/5);
  ASSERT_NE(coordinator.Start(), 0);
  CoordinatorLink link(OptionsFor(coordinator.address()));
  Observed seen;
  Observe(link, seen);
  link.Start();
  ASSERT_TRUE(link.WaitRegistered(kWait).ok());
  ASSERT_TRUE(coordinator.WaitForWatchers(1, kWait));
  pb::WorkItem stale = Item("op-of-another-coordinator");
  coordinator.PushAsIncarnation(stale, /*incarnation=*/99);
  ASSERT_TRUE(coordinator.WaitForRegistrations(2, kWait));
  ASSERT_TRUE(seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return seen.lost.size() == 1; }));
  ASSERT_TRUE(coordinator.WaitForOnlyStream(2, kWait));
  coordinator.Push(Item("op-current"));
  ASSERT_TRUE(seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !seen.items.empty(); }));
  absl::MutexLock lock(&seen.mu);
  EXPECT_TRUE(absl::StrContains(seen.lost[0].message(), "incarnation")) << seen.lost[0];
  ASSERT_EQ(seen.items.size(), 1u);
  EXPECT_EQ(seen.items[0].operation_id(), "op-current");
}

TEST(CoordinatorLinkTest, HeartbeatsTheCoordinatorAnswersLateStillKeepTheLeaseOnTheWorkersSide) {
  // A coordinator answering each heartbeat 350 ms late (overloaded: it renews the lease when
  // its handler runs, and extends leases by its own lag) keeps the worker alive; so must the
  // worker's own view of its lease, which gates every access to trainer memory. Before, each
  // heartbeat was cut at half the lease (300 ms) and the lease ran out here within a second.
  FakeCoordinator coordinator(/*incarnation=*/7, /*lease_ms=*/600);
  ASSERT_NE(coordinator.Start(), 0);
  CoordinatorLink link(OptionsFor(coordinator.address()));
  link.Start();
  ASSERT_TRUE(link.WaitRegistered(kWait).ok());
  const uint64_t epoch = link.registration_epoch();
  coordinator.DelayHeartbeats(absl::Milliseconds(350));
  const int before = coordinator.heartbeats();
  for (int i = 1; i <= 8; ++i) {
    ASSERT_TRUE(coordinator.WaitForHeartbeats(before + i, kWait));
    EXPECT_TRUE(link.LeaseStatus(epoch).ok())
        << "after late heartbeat " << i << ": " << link.LeaseStatus(epoch);
  }
  EXPECT_EQ(link.registration_epoch(), epoch);
  link.Stop(/*deregister=*/false);
}

TEST(CoordinatorLinkTest, WaitRegisteredNamesTheCoordinatorNobodyAnswersAt) {
  // A port that was just free: nothing listens there.
  FakeCoordinator gone(/*incarnation=*/3);
  const int port = gone.Start();
  ASSERT_NE(port, 0);
  gone.Stop();
  CoordinatorLink link(OptionsFor(absl::StrCat("127.0.0.1:", port)));
  link.Start();
  absl::Status s = link.WaitRegistered(absl::Milliseconds(500));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("127.0.0.1:", port))) << s;
  EXPECT_EQ(link.worker_id(), "");
  EXPECT_EQ(link.incarnation(), 0u);
  link.Stop(/*deregister=*/false);
}

}  // namespace
}  // namespace ckpt::worker
