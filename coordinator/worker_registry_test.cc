#include "coordinator/worker_registry.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

WorkerDescription Worker(const std::string& host, int64_t pid) {
  WorkerDescription d;
  d.host = host;
  d.pid = pid;
  d.data_plane_address = host + ":7000";
  d.memory_kinds = {pb::MEMORY_HOST};
  return d;
}

TEST(WorkerRegistryTest, RegisterAssignsDistinctIdsInOrder) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto a = registry.Register(Worker("node1", 100));
  auto b = registry.Register(Worker("node1", 101));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id, b->id);
  ASSERT_EQ(registry.All().size(), 2u);
  EXPECT_EQ(registry.All()[0]->id, a->id);
  EXPECT_EQ(registry.LiveCount(), 2);
}

TEST(WorkerRegistryTest, IdsCarryTheIncarnationAndIdsOfAnotherAreUnknown) {
  FakeClock clock;
  WorkerRegistry before(&clock, absl::Seconds(5), absl::Hours(1), "00000000000000aa");
  WorkerRegistry after(&clock, absl::Seconds(5), absl::Hours(1), "00000000000000bb");
  auto old_id = before.Register(Worker("node1", 100));
  auto new_id = after.Register(Worker("node2", 200));
  ASSERT_TRUE(old_id.ok() && new_id.ok());
  EXPECT_EQ(old_id->id, "w-00000000000000aa-1");
  EXPECT_EQ(new_id->id, "w-00000000000000bb-1");
  EXPECT_EQ(after.Find(old_id->id), nullptr);
  absl::Status s = after.Heartbeat(old_id->id);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("incarnation 00000000000000bb"));
  EXPECT_EQ(after.Find("w-1"), nullptr);
  EXPECT_TRUE(after.Heartbeat(new_id->id).ok());
}

TEST(WorkerRegistryTest, RejectsMissingHostOrPid) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  EXPECT_EQ(registry.Register(Worker("", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(Worker("h", 0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerRegistryTest, HeartbeatsKeepTheLeaseAlive) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto w = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(w.ok());
  for (int i = 0; i < 10; ++i) {
    clock.Advance(absl::Seconds(4));
    ASSERT_TRUE(registry.Heartbeat(w->id).ok());
    EXPECT_TRUE(registry.Tick().empty());
  }
  EXPECT_TRUE(registry.Find(w->id)->alive);
}

TEST(WorkerRegistryTest, MissedLeaseIsReportedOnceNamingHostAndPid) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto w = registry.Register(Worker("node7", 4242));
  auto other = registry.Register(Worker("node8", 1));
  ASSERT_TRUE(w.ok() && other.ok());
  clock.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry.Heartbeat(other->id).ok());
  EXPECT_TRUE(registry.Tick().empty());
  clock.Advance(absl::Seconds(1));
  auto expired = registry.Tick();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, w->id);
  EXPECT_THAT(expired[0].DebugString(), HasSubstr("node7"));
  EXPECT_THAT(expired[0].DebugString(), HasSubstr("4242"));
  EXPECT_THAT(expired[0].death_cause, HasSubstr("missed its lease"));
  EXPECT_TRUE(registry.Tick().empty());  // reported once
  EXPECT_FALSE(registry.Find(w->id)->alive);
  EXPECT_EQ(registry.LiveCount(), 1);
}

TEST(WorkerRegistryTest, AWorkerPastItsLeaseIsKeptForTheCoordinatorsOwnLag) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(10));
  auto w = registry.Register(Worker("node7", 4242));
  ASSERT_TRUE(w.ok());
  clock.Advance(absl::Seconds(12));
  EXPECT_TRUE(registry.Tick(absl::Seconds(5)).empty());  // 12 s < 10 s lease + 5 s lag
  clock.Advance(absl::Seconds(3));
  auto expired = registry.Tick(absl::Seconds(5));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_THAT(expired[0].death_cause, HasSubstr("last heartbeat 15s ago, after 5s more for the "
                                                "coordinator's own heartbeat lag"));
}

TEST(WorkerRegistryTest, HeartbeatAfterDeathMustReRegister) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto w = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(w.ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(registry.Tick().size(), 1u);
  absl::Status s = registry.Heartbeat(w->id);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("register again"));
  EXPECT_EQ(registry.Heartbeat("w-999").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Heartbeat("garbage").code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, ReRegisteringSameHostAndPidKeepsTheId) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto w = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(w.ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(registry.Tick().size(), 1u);
  WorkerDescription again = Worker("node1", 100);
  again.data_plane_address = "node1:7001";
  auto w2 = registry.Register(again);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(w2->id, w->id);
  EXPECT_TRUE(registry.Find(w->id)->alive);
  EXPECT_EQ(registry.Find(w->id)->description.data_plane_address, "node1:7001");
  EXPECT_TRUE(registry.Heartbeat(w->id).ok());
}

TEST(WorkerRegistryTest, DeadWorkersAreForgottenAfterRetention) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5), absl::Minutes(1));
  auto w = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(w.ok());
  clock.Advance(absl::Seconds(5));
  ASSERT_EQ(registry.Tick().size(), 1u);
  clock.Advance(absl::Seconds(59));
  registry.Tick();
  EXPECT_NE(registry.Find(w->id), nullptr);
  clock.Advance(absl::Seconds(1));
  registry.Tick();
  EXPECT_EQ(registry.Find(w->id), nullptr);
}

TEST(WorkerRegistryTest, DeregisterRemovesAtOnce) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto w = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(registry.Deregister(w->id).ok());
  EXPECT_EQ(registry.Find(w->id), nullptr);
  EXPECT_EQ(registry.Deregister(w->id).code(), absl::StatusCode::kNotFound);
  clock.Advance(absl::Seconds(10));
  EXPECT_TRUE(registry.Tick().empty());
}

TEST(WorkerRegistryTest, AtMostMaxDeadWorkersStayListedAndTheLongestDeadGoFirst) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5), absl::Hours(1), "", /*max_dead=*/2);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto w = registry.Register(Worker("node", 100 + i));
    ASSERT_TRUE(w.ok());
    ids.push_back(w->id);
    clock.Advance(absl::Seconds(1));  // each registered (and so dies) a second after the last
  }
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(registry.Tick().size(), 5u);  // each reported dead once, before any is forgotten
  EXPECT_EQ(registry.DeadCount(), 2);
  ASSERT_EQ(registry.All().size(), 2u);
  EXPECT_EQ(registry.All()[0]->id, ids[3]);
  EXPECT_EQ(registry.All()[1]->id, ids[4]);
  auto again = registry.Register(Worker("node", 104));  // the newest dead comes back
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, ids[4]);
  EXPECT_EQ(registry.DeadCount(), 1);
  EXPECT_TRUE(registry.Deregister(ids[3]).ok());
  EXPECT_EQ(registry.DeadCount(), 0);
}

TEST(WorkerRegistryTest, FindRegisteredFindsTheWorkerOfAHostAndPid) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(5));
  auto a = registry.Register(Worker("node1", 100));
  ASSERT_TRUE(a.ok());
  ASSERT_NE(registry.FindRegistered(Worker("node1", 100)), nullptr);
  EXPECT_EQ(registry.FindRegistered(Worker("node1", 100))->id, a->id);
  EXPECT_EQ(registry.FindRegistered(Worker("node1", 101)), nullptr);
}

}  // namespace
}  // namespace ckpt::coordinator
