// The coordinator answers light calls while an operation is being planned: the planner runs on
// the advancer thread without the service's lock (the gathered pieces are lent to it, not
// copied under the lock), so a worker's heartbeat, which renews its lease, never waits for a
// plan. The planner here blocks until the test saw the heartbeat answered.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_service.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  return c;
}

// A save kind whose planner says it started and then waits for the test's release; it and the
// committer record how many gathered pieces they saw.
class BlockingSaveKind final : public OperationKindHandler {
 public:
  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override {
    planned_shards = CountShards(op);
    planning.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
    return std::vector<RankPlan>(op.world_size, RankPlan{"part", 1});
  }
  absl::Status Commit(const Operation& op) override {
    committed_shards = CountShards(op);
    return absl::OkStatus();
  }
  absl::Status Finalize(const Operation&) override { return absl::OkStatus(); }

  static int CountShards(const Operation& op) {
    int n = 0;
    for (const RankEntry& e : op.ranks) n += static_cast<int>(e.shards.size());
    return n;
  }

  absl::Notification planning;
  absl::Notification release;
  int planned_shards = 0;
  int committed_shards = 0;
};

TEST(CoordinatorLockingTest, HeartbeatIsAnsweredWhileAPlanIsInProgress) {
  RealClock clock;
  BlockingSaveKind save_kind;
  CoordinatorOptions options;
  const char* tmp = std::getenv("TEST_TMPDIR");
  auto roots = CheckpointRoots::Create({tmp != nullptr ? tmp : "/tmp"});
  ASSERT_TRUE(roots.ok()) << roots.status();
  options.checkpoint_roots = *roots;
  CoordinatorService service(&clock, options);
  service.RegisterKind(OperationKind::kSave, &save_kind);
  service.Start();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto stub = pb::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  pb::RegisterWorkerRequest reg;
  reg.mutable_info()->set_host("node0");
  reg.mutable_info()->set_pid(10);
  pb::RegisterWorkerResponse worker;
  ASSERT_TRUE(stub->RegisterWorker(Ctx().get(), reg, &worker).ok());

  // The only rank joins: the operation enters planning and the join is answered after it.
  pb::JoinOperationRequest join;
  join.set_job("gpt");
  join.set_world_size(1);
  join.set_rank(0);
  join.set_kind(pb::OPERATION_SAVE);
  join.set_path(roots->roots()[0] + "/ckpt/1");
  join.set_worker_id(worker.worker_id());
  for (int i = 0; i < 3; ++i) join.mutable_state()->add_shards()->mutable_tensor()->set_key("w");
  pb::JoinOperationResponse joined;
  grpc::Status join_status;
  std::thread joiner([&] { join_status = stub->JoinOperation(Ctx().get(), join, &joined); });
  save_kind.planning.WaitForNotification();

  // The planner is running (blocked): a heartbeat and a status query are answered meanwhile.
  pb::HeartbeatRequest beat;
  beat.set_worker_id(worker.worker_id());
  pb::HeartbeatResponse beat_response;
  EXPECT_TRUE(stub->Heartbeat(Ctx().get(), beat, &beat_response).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.operations_size(), 1);
  EXPECT_EQ(status.operations(0).phase(), pb::PHASE_PLANNING);
  EXPECT_FALSE(joined.has_operation());  // the join waits for the plan

  save_kind.release.Notify();
  joiner.join();
  ASSERT_TRUE(join_status.ok()) << join_status.error_message();
  EXPECT_EQ(joined.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(save_kind.planned_shards, 3);  // the planner saw the gathered pieces

  // The pieces went back to the operation: the committer sees them too.
  pb::ReportResultRequest result;
  result.set_operation_id(joined.operation().id());
  result.set_rank(0);
  pb::ReportResultResponse reported;
  ASSERT_TRUE(stub->ReportResult(Ctx().get(), result, &reported).ok());
  EXPECT_EQ(reported.operation().phase(), pb::PHASE_DONE);
  EXPECT_EQ(save_kind.committed_shards, 3);

  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace ckpt::coordinator
