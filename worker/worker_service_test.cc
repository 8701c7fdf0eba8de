// WorkerService's plan-part bookkeeping, against a coordinator peer that is a real gRPC service
// on loopback (worker/fake_coordinator.h) reached through a real CoordinatorLink: parts arrive on
// the work stream, run on the real executors (the reshard executor wrapped to count runs; load
// parts read a real checkpoint into this process's shared memory, registered as a trainer's),
// and their results are reported with ReportResult.
#include "worker/worker_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
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

// A POSIX shared-memory segment of this process named as the client library of rank 0 of "job"
// names its segments, as a trainer shares its tensors.
class SharedSegmentForTest {
 public:
  explicit SharedSegmentForTest(size_t bytes)
      : name_(absl::StrCat("/ckpt.job.r0.p", getpid(), ".0")), bytes_(bytes) {
    shm_unlink(name_.c_str());
    int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(data, MAP_FAILED);
    data_ = static_cast<char*>(data);
    close(fd);
  }
  ~SharedSegmentForTest() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  char* data() const { return data_; }

 private:
  std::string name_;
  size_t bytes_;
  char* data_ = nullptr;
};

// Opens a session for this process as the trainer of rank 0 of "job" whose one tensor, w
// (rows x cols f32), lies in `segment`.
absl::StatusOr<std::string> ShareAsTrainerOfRank0(MemoryRegistry& registry,
                                                  const SharedSegmentForTest& segment, int64_t rows,
                                                  int64_t cols) {
  TrainerIdentity trainer;
  trainer.job = "job";
  trainer.rank = 0;
  trainer.world_size = 1;
  trainer.pid = getpid();
  trainer.uid = getuid();
  absl::StatusOr<std::string> session = registry.OpenSession(trainer);
  if (!session.ok()) return session.status();
  pb::SharedTensor tensor;
  tensor.mutable_shard()->mutable_tensor()->set_key("w");
  tensor.mutable_shard()->mutable_tensor()->set_dtype(pb::DTYPE_F32);
  tensor.mutable_shard()->mutable_tensor()->add_global_shape(rows);
  tensor.mutable_shard()->mutable_tensor()->add_global_shape(cols);
  *tensor.mutable_shard()->mutable_region() = RegionToProto(WholeRegion({rows, cols}));
  tensor.set_memory_kind(pb::MEMORY_HOST);
  tensor.set_segment(segment.name());
  tensor.set_nbytes(rows * cols * 4);
  if (absl::Status s = registry.RegisterTensors(*session, {tensor}); !s.ok()) return s;
  return session;
}

// A load part of rank 0 of "job" reading all of w (rows x cols f32) from `path`, directly.
pb::WorkItem DirectLoadPart(const std::string& operation_id, int rank, const std::string& path,
                            int64_t rows, int64_t cols) {
  pb::LoadPlanPart part;
  part.set_rank(rank);
  part.set_path(path);
  part.set_total_bytes(rows * cols * 4);
  part.set_algorithm(pb::LOAD_DIRECT);
  pb::LoadRead* read = part.add_reads();
  read->set_key("w");
  *read->mutable_region() = RegionToProto(WholeRegion({rows, cols}));
  read->set_local_index(0);
  read->set_size_bytes(rows * cols * 4);
  pb::WorkItem item;
  item.set_operation_id(operation_id);
  item.set_job("job");
  item.set_rank(rank);
  item.set_kind(pb::OPERATION_LOAD);
  item.set_plan_part(part.SerializeAsString());
  return item;
}

TEST_F(WorkerServiceTest, LoadPartFillsTheTrainersSharedTensorFromTheCheckpoint) {
  constexpr int64_t kRows = 16, kCols = 8;
  std::vector<float> stored(kRows * kCols);
  for (size_t i = 0; i < stored.size(); ++i) stored[i] = static_cast<float>(3 * i) - 7.5f;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/ws-load-", getpid());
  (void)RemoveTree(path);
  CheckpointContents contents;
  contents.tensors = {{"w", DType::kF32, {kRows, kCols}}};
  contents.files = {{0, {{"w", WholeRegion({kRows, kCols}), stored.data(), kRows * kCols * 4}}}};
  ASSERT_TRUE(WriteCheckpoint(path, contents, WriteOptions()).ok());

  // This process is the trainer of rank 0: its session holds w in a shared segment.
  SharedSegmentForTest segment(kRows * kCols * 4);
  auto session = ShareAsTrainerOfRank0(registry_, segment, kRows, kCols);
  ASSERT_TRUE(session.ok()) << session.status();

  coordinator_.Push(DirectLoadPart("op-load", 0, path, kRows, kCols));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  const pb::ReportResultRequest report = coordinator_.acknowledged_reports()[0];
  EXPECT_EQ(report.result().code(), 0) << report.result().message();
  EXPECT_GE(report.bytes_read(), kRows * kCols * 4);
  std::vector<float> loaded(kRows * kCols);
  std::memcpy(loaded.data(), segment.data(), loaded.size() * 4);
  EXPECT_EQ(loaded, stored);
  ASSERT_TRUE(registry_.CloseSession(*session).ok());
  (void)RemoveTree(path);
}

TEST_F(WorkerServiceTest, SavePartWritesTheTrainersTensorAndItsRecordCommitsToThoseBytes) {
  constexpr int64_t kRows = 16, kCols = 8;
  SharedSegmentForTest segment(kRows * kCols * 4);
  std::vector<float> values(kRows * kCols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f + 1;
  std::memcpy(segment.data(), values.data(), values.size() * 4);
  auto session = ShareAsTrainerOfRank0(registry_, segment, kRows, kCols);
  ASSERT_TRUE(session.ok()) << session.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dst = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/ws-save-", getpid());
  (void)RemoveTree(dst);
  auto staging = CreateStagingDir(dst, /*overwrite=*/false);
  ASSERT_TRUE(staging.ok()) << staging.status();

  pb::SavePlanPart part;
  part.set_rank(0);
  part.set_total_bytes(kRows * kCols * 4);
  part.set_staging_dir(*staging);
  pb::PlanFile* file = part.add_files();
  file->set_path("data/r0_0.safetensors");
  file->set_total_bytes(kRows * kCols * 4);
  pb::PlanPiece* piece = file->add_pieces();
  piece->set_key("w");
  piece->set_dtype(pb::DTYPE_F32);
  piece->add_global_shape(kRows);
  piece->add_global_shape(kCols);
  *piece->mutable_region() = RegionToProto(WholeRegion({kRows, kCols}));
  piece->set_size_bytes(kRows * kCols * 4);
  piece->set_local_index(0);
  pb::WorkItem item;
  item.set_operation_id("op-save");
  item.set_job("job");
  item.set_rank(0);
  item.set_kind(pb::OPERATION_SAVE);
  item.set_plan_part(part.SerializeAsString());
  coordinator_.Push(item);
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  const pb::ReportResultRequest report = coordinator_.acknowledged_reports()[0];
  ASSERT_EQ(report.result().code(), 0) << report.result().message();

  // The record commits (as the coordinator commits it) to the trainer's bytes.
  pb::Manifest written;
  ASSERT_TRUE(written.ParseFromString(report.written()));
  WrittenData data;
  data.pieces.assign(written.pieces().begin(), written.pieces().end());
  data.files.assign(written.files().begin(), written.files().end());
  pb::Manifest manifest = BuildManifest({{"w", DType::kF32, {kRows, kCols}}}, data,
                                        CheckpointContents(), kDefaultChecksumBlockBytes);
  absl::Status committed = CommitCheckpoint(*staging, dst, manifest, WriteOptions());
  ASSERT_TRUE(committed.ok()) << committed;
  auto reader = CheckpointReader::Open(dst);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> saved(kRows * kCols);
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({kRows, kCols}), saved.data()).ok());
  EXPECT_EQ(saved, values);
  ASSERT_TRUE(registry_.CloseSession(*session).ok());
  (void)RemoveTree(dst);
}

TEST_F(WorkerServiceTest, LoadPartWhoseTrainerIsNotConnectedIsRefusedNamingRankAndJob) {
  coordinator_.Push(DirectLoadPart("op-orphan", 5, "/nonexistent", 2, 2));
  ASSERT_TRUE(coordinator_.WaitForReports(1, kWait));
  const pb::ReportResultRequest report = coordinator_.acknowledged_reports()[0];
  EXPECT_EQ(report.result().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(report.result().message(),
                                "the trainer of rank 5 of job job is no longer connected"))
      << report.result().message();
}

}  // namespace
}  // namespace ckpt::worker
