// WorkerService's plan-part bookkeeping, against a coordinator peer that is a real gRPC service
// on loopback (worker/fake_coordinator.h) reached through a real CoordinatorLink: parts arrive on
// the work stream, run on the real reshard executor (wrapped to count runs), and their results
// are reported with ReportResult.
#include "worker/worker_service.h"

#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "worker/coordinator_link.h"
#include "worker/fake_coordinator.h"
#include "worker/memory_registry.h"
#include "worker/part_executors.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// The real reshard executor, counting the parts it runs by rank; a part of `held_rank` waits for
// `release` before it runs (so that a test can act while the part is still running).
class CountingReshardExecutor final : public PartExecutor {
 public:
  bool NeedsTrainer() const override { return false; }
  PartOutcome Execute(const PartRun& run) override {
    {
      absl::MutexLock lock(&mu_);
      ++runs_[run.item.rank()];
    }
    if (run.item.rank() == held_rank) {
      started.Notify();
      release.WaitForNotificationWithTimeout(kWait);
    }
    return real_.Execute(run);
  }
  int runs(int rank) const {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(rank);
    return it == runs_.end() ? 0 : it->second;
  }

  int held_rank = -1;
  absl::Notification started;
  absl::Notification release;

 private:
  ReshardPartExecutor real_;
  mutable absl::Mutex mu_;
  std::map<int, int> runs_ ABSL_GUARDED_BY(mu_);
};

// A reshard part of `rank` with no files: the real executor runs it and records an empty write.
pb::WorkItem EmptyReshardPart(const std::string& operation_id, int rank) {
  pb::ReshardPlanPart part;
  part.set_rank(rank);
  part.set_source("/nonexistent/source");
  part.set_staging_dir("/nonexistent/staging");
  pb::WorkItem item;
  item.set_operation_id(operation_id);
  item.set_job("job");
  item.set_rank(rank);
  item.set_kind(pb::OPERATION_RESHARD);
  item.set_plan_part(part.SerializeAsString());
  return item;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(coordinator_.Start(), 0);
    LinkOptions options;
    options.coordinator = coordinator_.address();
    options.info.set_host("testhost");
    options.rpc_timeout = absl::Seconds(5);
    link_ = std::make_unique<CoordinatorLink>(options);
    service_ = std::make_unique<WorkerService>(&registry_, link_.get(), "testhost");
    auto executor = std::make_unique<CountingReshardExecutor>();
    executor_ = executor.get();
    service_->RegisterPartExecutor(pb::OPERATION_RESHARD, std::move(executor));
    link_->SetWorkHandler([this](const pb::WorkItem& item) { service_->OnWorkItem(item); });
    link_->Start();
    ASSERT_TRUE(link_->WaitRegistered(kWait).ok());
    ASSERT_TRUE(coordinator_.WaitForWatchers(1, kWait));
  }
  void TearDown() override {
    if (executor_ != nullptr && !executor_->release.HasBeenNotified()) executor_->release.Notify();
    link_->Stop(/*deregister=*/false);
    service_->Shutdown();
    coordinator_.Stop();
  }

  FakeCoordinator coordinator_{/*incarnation=*/0x1234};
  MemoryRegistry registry_;
  std::unique_ptr<CoordinatorLink> link_;
  std::unique_ptr<WorkerService> service_;
  CountingReshardExecutor* executor_ = nullptr;
};

TEST_F(WorkerServiceTest, ResentPartThatAlreadyRanIsAnsweredFromItsRecordWithoutRunningAgain) {
  coordinator_.Push(EmptyReshardPart("op-1", 0));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  // The coordinator sends the part again (e.g. its work stream was re-established before it
  // took the report): the worker answers with the recorded result instead of dropping it.
  coordinator_.Push(EmptyReshardPart("op-1", 0));
  ASSERT_TRUE(coordinator_.WaitForReports(2, kWait));
  std::vector<pb::ReportResultRequest> reports = coordinator_.acknowledged_reports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].operation_id(), "op-1");
  EXPECT_EQ(reports[0].result().code(), 0) << reports[0].result().message();
  EXPECT_EQ(reports[1].SerializeAsString(), reports[0].SerializeAsString());
  EXPECT_EQ(executor_->runs(0), 1);
}

TEST_F(WorkerServiceTest, ResultReportIsRetriedThroughTransientErrorsUntilAcknowledged) {
  coordinator_.FailNextReports({grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED,
                                grpc::StatusCode::RESOURCE_EXHAUSTED});
  coordinator_.Push(EmptyReshardPart("op-2", 3));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  EXPECT_EQ(coordinator_.report_calls(), 4);
  std::vector<pb::ReportResultRequest> reports = coordinator_.acknowledged_reports();
  EXPECT_EQ(reports[0].rank(), 3);
  EXPECT_EQ(executor_->runs(3), 1);
}

TEST_F(WorkerServiceTest, PartResentAfterARefusedReportIsAnsweredAgainFromItsRecord) {
  // A non-transient refusal ends the reporting (the coordinator cannot take it now)...
  coordinator_.FailNextReports({grpc::StatusCode::FAILED_PRECONDITION});
  coordinator_.Push(EmptyReshardPart("op-3", 1));
  ASSERT_TRUE(coordinator_.WaitForReportCalls(1, kWait));
  // ...but when the coordinator later sends the part again, the recorded result goes out.
  coordinator_.Push(EmptyReshardPart("op-3", 1));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  EXPECT_EQ(coordinator_.acknowledged_reports()[0].operation_id(), "op-3");
  EXPECT_EQ(executor_->runs(1), 1);
}

TEST_F(WorkerServiceTest, PartResentWhileStillRunningIsNotStartedTwice) {
  executor_->held_rank = 0;
  coordinator_.Push(EmptyReshardPart("op-4", 0));
  ASSERT_TRUE(executor_->started.WaitForNotificationWithTimeout(kWait));
  coordinator_.Push(EmptyReshardPart("op-4", 0));
  // Items arrive in order on one stream: once the part of rank 1 pushed after the duplicate has
  // been reported, the duplicate has been handled.
  coordinator_.Push(EmptyReshardPart("op-4", 1));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  EXPECT_EQ(coordinator_.acknowledged_reports()[0].rank(), 1);
  executor_->release.Notify();
  ASSERT_TRUE(coordinator_.WaitForReports(2, kWait));
  EXPECT_EQ(coordinator_.acknowledged_reports()[1].rank(), 0);
  EXPECT_EQ(executor_->runs(0), 1);
}

TEST_F(WorkerServiceTest, FailedPartIsReportedNamingTheWorkerAndItsErrorResentNotRerun) {
  pb::WorkItem item = EmptyReshardPart("op-5", 2);
  item.set_plan_part("\xff\xff not a plan part");
  coordinator_.Push(item);
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  coordinator_.Push(item);
  ASSERT_TRUE(coordinator_.WaitForReports(2, kWait));
  std::vector<pb::ReportResultRequest> reports = coordinator_.acknowledged_reports();
  EXPECT_EQ(reports[0].result().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(reports[0].result().message(), "unreadable reshard plan part"))
      << reports[0].result().message();
  EXPECT_TRUE(absl::StrContains(reports[0].result().message(), "on host testhost"))
      << reports[0].result().message();
  EXPECT_EQ(reports[1].SerializeAsString(), reports[0].SerializeAsString());
  EXPECT_EQ(executor_->runs(2), 1);
}

TEST_F(WorkerServiceTest, PartOfAKindWithoutAnExecutorIsRefusedNamingTheKind) {
  pb::WorkItem item = EmptyReshardPart("op-6", 0);
  item.set_kind(pb::OPERATION_KIND_UNSPECIFIED);
  coordinator_.Push(item);
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  const pb::ReportResultRequest report = coordinator_.acknowledged_reports()[0];
  EXPECT_EQ(report.result().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(report.result().message(), "OPERATION_KIND_UNSPECIFIED"))
      << report.result().message();
}

}  // namespace
}  // namespace ckpt::worker
