// The coordinator answers a worker's heartbeat (its lease renewal) whatever the service is
// doing: the planner runs on the advancer thread without the service's lock (the gathered
// pieces are lent to it, not copied under the lock), and a live worker's renewal is recorded
// in the lease book, which does not take that lock at all. The save kind here blocks its
// planner or finalizer until the test saw the heartbeat answered. Planning's storage step
// (Prepare) runs without the lock too, and a kept plan (ReusedPlan) is taken under it without
// lending the gathered pieces or running the planner.
#include <grpcpp/grpcpp.h>

#include <atomic>
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
  absl::Status Prepare(const Operation& op) override {
    prepared_with_ranks = static_cast<int>(op.ranks.size());
    if (block_prepare) {
      preparing.Notify();
      prepare_release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    return absl::OkStatus();
  }
  std::optional<std::vector<RankPlan>> ReusedPlan(const Operation& op) override {
    if (!reuse) return std::nullopt;
    reused_shards = CountShards(op);
    std::vector<RankPlan> kept(op.world_size, RankPlan{"kept", 1});
    for (RankPlan& plan : kept) plan.reused = true;
    return kept;
  }
  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override {
    planned_shards = CountShards(op);
    planning.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
    return std::vector<RankPlan>(op.world_size, RankPlan{"part", 1});
  }
  absl::Status Commit(Operation& op) override {
    committed_shards = CountShards(op);
    return absl::OkStatus();
  }
  absl::Status Finalize(const Operation&) override {
    ++finalized;
    if (block_finalize) {
      finalizing.Notify();
      finalize_release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    return absl::OkStatus();
  }

  static int CountShards(const Operation& op) {
    int n = 0;
    for (const RankEntry& e : op.ranks) n += static_cast<int>(e.shards.size());
    return n;
  }

  bool block_finalize = false;  // set before the operation ends
  bool block_prepare = false;   // set before the operation is gathered
  bool reuse = false;           // ReusedPlan gives a kept plan
  absl::Notification preparing;
  absl::Notification prepare_release;
  int prepared_with_ranks = -1;
  int reused_shards = 0;
  std::atomic<int> finalized{0};
  absl::Notification finalizing;
  absl::Notification finalize_release;
  absl::Notification planning;
  absl::Notification release;
  int planned_shards = 0;
  int committed_shards = 0;
};

// A coordinator on a real in-process gRPC server with the blocking save kind, one registered
// worker, and a job of one rank.
class CoordinatorLockingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto roots = CheckpointRoots::Create({tmp != nullptr ? tmp : "/tmp"});
    ASSERT_TRUE(roots.ok()) << roots.status();
    CoordinatorOptions options;
    options.checkpoint_roots = *roots;
    path_ = roots->roots()[0] + "/ckpt/1";
    service_ = std::make_unique<CoordinatorService>(&clock_, options);
    service_->RegisterKind(OperationKind::kSave, &save_kind_);
    service_->Start();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = pb::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    pb::RegisterWorkerRequest reg;
    reg.mutable_info()->set_host("node0");
    reg.mutable_info()->set_pid(10);
    pb::RegisterWorkerResponse worker;
    ASSERT_TRUE(stub_->RegisterWorker(Ctx().get(), reg, &worker).ok());
    worker_id_ = worker.worker_id();
  }
  void TearDown() override {
    for (absl::Notification* n :
         {&save_kind_.release, &save_kind_.finalize_release, &save_kind_.prepare_release}) {
      if (!n->HasBeenNotified()) n->Notify();
    }
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now());
  }

  // The only rank joins with three pieces: the operation enters planning, and the join is
  // answered after the planner ran.
  grpc::Status JoinTheOnlyRank(pb::JoinOperationResponse* joined) {
    pb::JoinOperationRequest join;
    join.set_job("gpt");
    join.set_world_size(1);
    join.set_rank(0);
    join.set_kind(pb::OPERATION_SAVE);
    join.set_path(path_);
    join.set_worker_id(worker_id_);
    for (int i = 0; i < 3; ++i) join.mutable_state()->add_shards()->mutable_tensor()->set_key("w");
    return stub_->JoinOperation(Ctx().get(), join, joined);
  }
  // While a planning step is blocked: the worker's heartbeat and a status query (the
  // operation still planning) are answered.
  void ExpectAnsweredWhilePlanning() {
    EXPECT_TRUE(Heartbeat().ok());
    pb::GetStatusResponse status;
    ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
    ASSERT_EQ(status.operations_size(), 1);
    EXPECT_EQ(status.operations(0).phase(), pb::PHASE_PLANNING);
  }
  // The only rank reports success: the operation commits, and the committer saw its three
  // gathered pieces.
  void ExpectTheOnlyRankCommits(const pb::JoinOperationResponse& joined) {
    pb::ReportResultRequest result;
    result.set_operation_id(joined.operation().id());
    result.set_rank(0);
    pb::ReportResultResponse reported;
    ASSERT_TRUE(stub_->ReportResult(Ctx().get(), result, &reported).ok());
    EXPECT_EQ(reported.operation().phase(), pb::PHASE_DONE);
    EXPECT_EQ(save_kind_.committed_shards, 3);
  }
  // The worker's heartbeat, with a deadline shorter than the blocked step's release.
  grpc::Status Heartbeat() {
    pb::HeartbeatRequest beat;
    beat.set_worker_id(worker_id_);
    pb::HeartbeatResponse response;
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return stub_->Heartbeat(context.get(), beat, &response);
  }

  RealClock clock_;
  BlockingSaveKind save_kind_;  // outlives service_
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::string path_;
  std::string worker_id_;
};

TEST_F(CoordinatorLockingTest, HeartbeatIsAnsweredWhileAPlanIsInProgress) {
  pb::JoinOperationResponse joined;
  grpc::Status join_status;
  std::thread joiner([&] { join_status = JoinTheOnlyRank(&joined); });
  save_kind_.planning.WaitForNotification();

  // The planner is running (blocked): a heartbeat and a status query are answered meanwhile.
  ASSERT_NO_FATAL_FAILURE(ExpectAnsweredWhilePlanning());

  save_kind_.release.Notify();
  joiner.join();
  ASSERT_TRUE(join_status.ok()) << join_status.error_message();
  EXPECT_EQ(joined.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(save_kind_.planned_shards, 3);  // the planner saw the gathered pieces

  // The pieces went back to the operation: the committer sees them too.
  ExpectTheOnlyRankCommits(joined);
}

// A live worker's heartbeat does not take the service's lock at all: it is answered while a
// finalizer (which runs under that lock) is blocked.
TEST_F(CoordinatorLockingTest, HeartbeatIsAnsweredWhileTheServiceLockIsHeld) {
  save_kind_.release.Notify();
  save_kind_.block_finalize = true;
  pb::JoinOperationResponse joined;
  ASSERT_TRUE(JoinTheOnlyRank(&joined).ok());
  pb::ReportResultRequest result;
  result.set_operation_id(joined.operation().id());
  result.set_rank(0);
  pb::ReportResultResponse reported;
  grpc::Status report_status;
  std::thread reporter(
      [&] { report_status = stub_->ReportResult(Ctx().get(), result, &reported); });
  save_kind_.finalizing.WaitForNotification();  // the service's lock is held from here

  grpc::Status beat = Heartbeat();
  EXPECT_TRUE(beat.ok()) << beat.error_message();

  save_kind_.finalize_release.Notify();
  reporter.join();
  ASSERT_TRUE(report_status.ok()) << report_status.error_message();
  EXPECT_EQ(reported.operation().phase(), pb::PHASE_DONE);
  EXPECT_TRUE(Heartbeat().ok());
}

// Planning's storage step (a save's staging directory) runs without the service's lock, on
// the operation without its ranks: a heartbeat and a status query are answered meanwhile.
TEST_F(CoordinatorLockingTest, HeartbeatIsAnsweredWhilePlanningPreparesStorage) {
  save_kind_.block_prepare = true;
  save_kind_.release.Notify();
  pb::JoinOperationResponse joined;
  grpc::Status join_status;
  std::thread joiner([&] { join_status = JoinTheOnlyRank(&joined); });
  save_kind_.preparing.WaitForNotification();

  ASSERT_NO_FATAL_FAILURE(ExpectAnsweredWhilePlanning());

  save_kind_.prepare_release.Notify();
  joiner.join();
  ASSERT_TRUE(join_status.ok()) << join_status.error_message();
  EXPECT_EQ(joined.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(save_kind_.prepared_with_ranks, 0);
  EXPECT_EQ(save_kind_.planned_shards, 3);
}

// A kept plan is set without running the planner (which here would block until the test
// ends) and without lending the gathered pieces: ReusedPlan sees them in the operation, and
// the committer still does.
TEST_F(CoordinatorLockingTest, AKeptPlanIsSetWithoutRunningThePlanner) {
  save_kind_.reuse = true;
  pb::JoinOperationResponse joined;
  ASSERT_TRUE(JoinTheOnlyRank(&joined).ok());
  EXPECT_EQ(joined.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_FALSE(save_kind_.planning.HasBeenNotified());
  EXPECT_EQ(save_kind_.reused_shards, 3);

  ExpectTheOnlyRankCommits(joined);
}

// An operation that ends while its storage step runs (here its only worker leaves) is
// finalized once more after that step, since its first Finalize may have come before the step
// made anything (a staging directory); it is never planned.
TEST_F(CoordinatorLockingTest, AnOperationEndedWhilePreparingIsFinalizedAfterThePreparation) {
  save_kind_.block_prepare = true;
  pb::JoinOperationResponse joined;
  grpc::Status join_status;
  std::thread joiner([&] { join_status = JoinTheOnlyRank(&joined); });
  save_kind_.preparing.WaitForNotification();

  pb::DeregisterWorkerRequest leave;
  leave.set_worker_id(worker_id_);
  pb::DeregisterWorkerResponse left;
  ASSERT_TRUE(stub_->DeregisterWorker(Ctx().get(), leave, &left).ok());
  EXPECT_EQ(save_kind_.finalized.load(), 1);  // the abort's, while Prepare still runs

  save_kind_.prepare_release.Notify();
  joiner.join();  // answered after the advancer's planning step
  EXPECT_EQ(save_kind_.finalized.load(), 2);
  EXPECT_FALSE(save_kind_.planning.HasBeenNotified());
  ASSERT_TRUE(join_status.ok()) << join_status.error_message();
  EXPECT_EQ(joined.operation().phase(), pb::PHASE_ABORTED) << joined.DebugString();
}

}  // namespace
}  // namespace ckpt::coordinator
