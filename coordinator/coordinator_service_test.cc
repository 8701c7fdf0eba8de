// The Coordinator service over a real in-process gRPC server, with test planners and
// committers: plan parts reach the right worker over WatchWork, progress and results drive the
// operation to commit, and a failure is streamed as an abort to the other workers.
#include "coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/operation_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/rank_description.h"
#include "proto/state_digest.h"
#include "proto/status_detail.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace ckpt::coordinator {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return c;
}

// Collects a worker's WatchWork stream on a thread.
class Watcher {
 public:
  Watcher(pb::Coordinator::Stub* stub, const std::string& worker_id) {
    pb::WatchWorkRequest request;
    request.set_worker_id(worker_id);
    reader_ = stub->WatchWork(&context_, request);
    thread_ = std::thread([this] {
      pb::WorkItem item;
      while (reader_->Read(&item)) {
        std::lock_guard<std::mutex> lock(mu_);
        if (item.stream_opened()) ++opened_;
        google::protobuf::RepeatedPtrField<pb::WorkItem> batched;
        batched.Swap(item.mutable_batched());
        const size_t before = items_.size();
        Keep(item);
        for (const pb::WorkItem& more : batched) Keep(more);
        if (items_.size() > before) ++messages_;
        arrived_.notify_all();
      }
    });
  }
  ~Watcher() {
    context_.TryCancel();
    thread_.join();
    (void)reader_->Finish();
  }
  // Waits until at least n items arrived; returns them.
  std::vector<pb::WorkItem> Await(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    arrived_.wait_for(lock, std::chrono::seconds(10), [this, n] { return items_.size() >= n; });
    return items_;
  }
  // How many stream messages carried them (a message may batch several items).
  size_t messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  // Waits until at least n `ended` items arrived; returns them (kept apart from the others).
  std::vector<pb::WorkItem> AwaitEnds(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    arrived_.wait_for(lock, std::chrono::seconds(10), [this, n] { return ends_.size() >= n; });
    return ends_;
  }
  // Waits until the stream's first message arrived; returns how many were marked
  // stream_opened.
  int AwaitOpened() {
    std::unique_lock<std::mutex> lock(mu_);
    arrived_.wait_for(lock, std::chrono::seconds(10), [this] { return opened_ > 0; });
    return opened_;
  }

 private:
  // Files `item`: the stream's opening mark alone is not kept, an `ended` item goes to ends_.
  void Keep(const pb::WorkItem& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (item.has_ended()) {
      ends_.push_back(item);
    } else if (!(item.stream_opened() && item.item_case() == pb::WorkItem::ITEM_NOT_SET)) {
      items_.push_back(item);
    }
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<pb::WorkItem>> reader_;
  std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<pb::WorkItem> items_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::WorkItem> ends_ ABSL_GUARDED_BY(mu_);
  size_t messages_ ABSL_GUARDED_BY(mu_) = 0;
  int opened_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// A save kind that records what the service asked of it: the shards it planned over and the
// path it committed (whose result the test chooses).
class RecordingSaveKind final : public OperationKindHandler {
 public:
  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override {
    planned_shards = 0;
    planned_pieces.assign(op.world_size, {});
    std::vector<RankPlan> plans;
    for (int r = 0; r < op.world_size; ++r) {
      planned_shards += static_cast<int>(op.ranks[r].shards.size());
      planned_pieces[r] = op.ranks[r].shards.Pieces();
      plans.push_back({absl::StrCat("part-for-rank-", r), 100 * (r + 1)});
    }
    return plans;
  }
  absl::Status Commit(Operation& op) override {
    committed_path = op.path;
    return commit_result;
  }
  absl::Status Finalize(const Operation& op) override {
    finalized.push_back(op.id);
    return absl::OkStatus();
  }

  int planned_shards = 0;
  std::vector<std::vector<pb::PieceMeta>> planned_pieces;  // per rank, as planned over
  std::string committed_path;
  absl::Status commit_result = absl::OkStatus();
  std::vector<std::string> finalized;
};

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  // `configure` runs on the service before it starts (e.g. to give it a memory catalog).
  void StartServer(int64_t description_cache_bytes = int64_t{2} << 30,
                   const std::function<void(CoordinatorService&)>& configure = nullptr) {
    CoordinatorOptions options;
    options.lease = absl::Seconds(30);
    options.description_cache_bytes = description_cache_bytes;
    options.piece_list_wait = piece_list_wait_;
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto roots = CheckpointRoots::Create({tmp != nullptr ? tmp : "/tmp"});
    ASSERT_TRUE(roots.ok()) << roots.status();
    options.checkpoint_roots = *roots;
    checkpoint_path_ = roots->roots()[0] + "/ckpt/1";
    if (options_hook_) options_hook_(options);
    service_ = std::make_unique<CoordinatorService>(&clock_, options);
    service_->RegisterKind(OperationKind::kSave, &save_kind_);
    if (configure) configure(*service_);
    service_->Start();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    stub_ =
        pb::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (service_) service_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::string Register(const std::string& host, int pid) {
    pb::RegisterWorkerRequest request;
    request.mutable_info()->set_host(host);
    request.mutable_info()->set_pid(pid);
    pb::RegisterWorkerResponse response;
    EXPECT_TRUE(stub_->RegisterWorker(Ctx().get(), request, &response).ok());
    return response.worker_id();
  }

  grpc::Status Join(const std::string& worker, int rank, int world, pb::JoinOperationResponse* out,
                    int64_t arrival_deadline_ms = 0) {
    return stub_->JoinOperation(Ctx().get(), JoinRequest(worker, rank, world, arrival_deadline_ms),
                                out);
  }
  pb::JoinOperationRequest JoinRequest(const std::string& worker, int rank, int world,
                                       int64_t arrival_deadline_ms = 0) {
    pb::JoinOperationRequest request;
    request.set_arrival_deadline_ms(arrival_deadline_ms);
    request.set_job("gpt");
    request.set_world_size(world);
    request.set_rank(rank);
    request.set_kind(pb::OPERATION_SAVE);
    request.set_path(checkpoint_path_);
    request.set_worker_id(worker);
    request.mutable_state()->add_shards()->mutable_tensor()->set_key(absl::StrCat("w", rank));
    return request;
  }

  grpc::Status Report(const std::string& op, int rank, const absl::Status& result) {
    pb::ReportResultRequest request;
    request.set_operation_id(op);
    request.set_rank(rank);
    *request.mutable_result() = ToDetail(result);
    pb::ReportResultResponse response;
    return stub_->ReportResult(Ctx().get(), request, &response);
  }

  pb::OperationStatus Wait(const std::string& op) {
    pb::WaitOperationRequest request;
    request.set_operation_id(op);
    request.set_timeout_ms(5000);
    pb::OperationStatus status;
    EXPECT_TRUE(stub_->WaitOperation(Ctx().get(), request, &status).ok());
    return status;
  }

  RealClock clock_;
  absl::Duration piece_list_wait_ = absl::Seconds(30);
  std::function<void(CoordinatorOptions&)> options_hook_;  // runs before the service is made
  RecordingSaveKind save_kind_;                            // outlives service_
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::string checkpoint_path_;  // under the service's checkpoint root
  std::string address_;
};

TEST_F(CoordinatorServiceTest, PlanPartsReachTheirWorkersAndResultsCommit) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j0, j1;
  ASSERT_TRUE(Join(w0, 0, 2, &j0).ok());
  EXPECT_EQ(j0.operation().phase(), pb::PHASE_GATHERING);
  ASSERT_TRUE(Join(w1, 1, 2, &j1).ok());
  EXPECT_EQ(j1.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(j1.operation().bytes_total(), 300);
  EXPECT_EQ(save_kind_.planned_shards, 2);  // the planner saw every rank's gathered metadata
  const std::string op = j0.operation().id();

  std::vector<pb::WorkItem> items0 = watch0.Await(1), items1 = watch1.Await(1);
  ASSERT_EQ(items0.size(), 1u);
  EXPECT_EQ(items0[0].operation_id(), op);
  EXPECT_EQ(items0[0].rank(), 0);
  EXPECT_EQ(items0[0].plan_part(), "part-for-rank-0");
  ASSERT_EQ(items1.size(), 1u);
  EXPECT_EQ(items1[0].plan_part(), "part-for-rank-1");

  pb::ReportProgressRequest progress;
  progress.set_operation_id(op);
  progress.set_rank(1);
  progress.set_bytes_done(150);
  pb::ReportProgressResponse ignored;
  ASSERT_TRUE(stub_->ReportProgress(Ctx().get(), progress, &ignored).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.operations_size(), 1);
  EXPECT_EQ(status.operations(0).bytes_done(), 150);

  ASSERT_TRUE(Report(op, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(Report(op, 1, absl::OkStatus()).ok());
  pb::OperationStatus done = Wait(op);
  EXPECT_EQ(done.phase(), pb::PHASE_DONE);
  EXPECT_EQ(done.bytes_done(), 300);
  EXPECT_EQ(save_kind_.committed_path, checkpoint_path_);
}

// The ranks of one operation name one path, so the coordinator resolves it once per gather:
// a symbolic link changed while the ranks join does not split them (the late rank joins the
// path the first resolved), and the next operation follows the link as it is then; a join
// that joined nothing leaves no resolution behind.
TEST_F(CoordinatorServiceTest, AJoinPathIsResolvedOncePerGatherAndAfreshForTheNextOperation) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string root = checkpoint_path_.substr(0, checkpoint_path_.rfind("/ckpt/1"));
  const std::string a = root + "/resolve-a", b = root + "/resolve-b", link = root + "/latest";
  ASSERT_EQ(mkdir(a.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(b.c_str(), 0700), 0);
  ASSERT_EQ(symlink(a.c_str(), link.c_str()), 0);
  checkpoint_path_ = link + "/ckpt";
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  pb::JoinOperationResponse refused, j0, j1;
  // A join no operation took (its worker is unknown) leaves no resolution behind.
  ASSERT_EQ(Join("no-such-worker", 0, 2, &refused).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_EQ(unlink(link.c_str()), 0);
  ASSERT_EQ(symlink(b.c_str(), link.c_str()), 0);
  ASSERT_TRUE(Join(w0, 0, 2, &j0).ok());
  EXPECT_EQ(j0.operation().path(), b + "/ckpt");
  ASSERT_EQ(unlink(link.c_str()), 0);
  ASSERT_EQ(symlink(a.c_str(), link.c_str()), 0);
  ASSERT_TRUE(Join(w1, 1, 2, &j1).ok());
  EXPECT_EQ(j1.operation().id(), j0.operation().id());
  EXPECT_EQ(j1.operation().path(), b + "/ckpt");
  const std::string op = j0.operation().id();
  ASSERT_TRUE(Report(op, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(Report(op, 1, absl::OkStatus()).ok());
  EXPECT_EQ(Wait(op).phase(), pb::PHASE_DONE);
  EXPECT_EQ(save_kind_.committed_path, b + "/ckpt");

  pb::JoinOperationResponse next;
  ASSERT_TRUE(Join(w0, 0, 2, &next).ok());
  EXPECT_NE(next.operation().id(), op);
  EXPECT_EQ(next.operation().path(), a + "/ckpt");
}

// Each stream opens marked stream_opened, and brings each worker the end of every operation
// it has a joined rank in, once, with the final status a WaitOperation answers: a worker's
// trainers wait for it without a call at the coordinator (issue 16). A stream opened after
// the end does not bring it (the worker asks the coordinator then).
TEST_F(CoordinatorServiceTest, EachStreamOpensMarkedAndBringsTheEndOfItsWorkersOperationsOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  ASSERT_EQ(watch0.AwaitOpened(), 1);
  ASSERT_EQ(watch1.AwaitOpened(), 1);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 2, &j).ok());
  ASSERT_TRUE(Join(w1, 1, 2, &j).ok());
  const std::string op = j.operation().id();
  ASSERT_TRUE(Report(op, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(Report(op, 1, absl::OkStatus()).ok());
  const pb::OperationStatus done = Wait(op);
  ASSERT_EQ(done.phase(), pb::PHASE_DONE);
  for (Watcher* watch : {&watch0, &watch1}) {
    const std::vector<pb::WorkItem> ends = watch->AwaitEnds(1);
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_EQ(ends[0].operation_id(), op);
    EXPECT_EQ(ends[0].ended().id(), op);
    EXPECT_EQ(ends[0].ended().phase(), pb::PHASE_DONE);
    EXPECT_EQ(ends[0].ended().bytes_done(), done.bytes_done());
    EXPECT_EQ(ends[0].ended().SerializeAsString(), done.SerializeAsString());
  }
  Watcher late(stub_.get(), w0);  // replaces watch0: one stream per worker
  ASSERT_EQ(late.AwaitOpened(), 1);
  // Another operation's end, on w0's stream, orders this check without sleeping.
  pb::JoinOperationResponse k;
  ASSERT_TRUE(Join(w0, 0, 2, &k).ok());
  ASSERT_TRUE(Join(w1, 1, 2, &k).ok());
  const std::string second = k.operation().id();
  ASSERT_NE(second, op);
  ASSERT_TRUE(Report(second, 0, absl::DataLossError("short write to data/0")).ok());
  const std::vector<pb::WorkItem> late_ends = late.AwaitEnds(1);
  ASSERT_EQ(late_ends.size(), 1u);
  EXPECT_EQ(late_ends[0].operation_id(), second);  // not the first operation's
  EXPECT_EQ(late_ends[0].ended().phase(), pb::PHASE_ABORTED);
  EXPECT_THAT(late_ends[0].ended().status().message(), HasSubstr("short write"));
  EXPECT_EQ(watch0.AwaitEnds(1).size(), 1u);  // it had ended before the second operation
  EXPECT_EQ(watch0.AwaitOpened(), 1);         // one mark per stream
}

// Each join is answered as JoinOperation would, but with the operation as it stood once the
// call's joins were all done (one OperationStatus per operation and call): here planning, as
// the call completed the gather, or already executing.
TEST_F(CoordinatorServiceTest, JoinOperationsAnswersEachJoinAsJoinOperationWouldInOneCall) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string w0 = Register("node0", 10);
  pb::JoinOperationsRequest request;
  *request.add_joins() = JoinRequest(w0, 0, 3);
  *request.add_joins() = JoinRequest(w0, 2, 3, /*arrival_deadline_ms=*/-1);  // refused alone
  *request.add_joins() = JoinRequest(w0, 1, 3);
  *request.add_joins() = JoinRequest(w0, 2, 3);  // completes the gather: answered after planning
  pb::JoinOperationsResponse response;
  ASSERT_TRUE(stub_->JoinOperations(Ctx().get(), request, &response).ok());
  ASSERT_EQ(response.results_size(), 4);
  EXPECT_EQ(response.results(0).status().code(), 0);
  EXPECT_THAT(response.results(0).response().operation().phase(),
              AnyOf(pb::PHASE_PLANNING, pb::PHASE_EXECUTING));
  EXPECT_EQ(response.results(1).status().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(response.results(1).status().message(), HasSubstr("rank 2"));
  EXPECT_THAT(response.results(1).status().message(), HasSubstr("negative arrival_deadline_ms"));
  EXPECT_FALSE(response.results(1).has_response());
  EXPECT_EQ(response.results(2).response().operation().phase(),
            response.results(0).response().operation().phase());
  EXPECT_EQ(response.results(2).response().operation().id(),
            response.results(0).response().operation().id());
  EXPECT_EQ(response.results(3).status().code(), 0);
  EXPECT_EQ(response.results(3).response().operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(response.results(3).response().operation().id(),
            response.results(0).response().operation().id());
  EXPECT_EQ(save_kind_.planned_shards, 3);
}

TEST_F(CoordinatorServiceTest, AWorkersPartsQueuedTogetherGoInOneStreamMessage) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string w0 = Register("node0", 10);
  Watcher watch(stub_.get(), w0);
  pb::JoinOperationsRequest request;
  for (int r = 0; r < 3; ++r) *request.add_joins() = JoinRequest(w0, r, 3);
  pb::JoinOperationsResponse response;
  ASSERT_TRUE(stub_->JoinOperations(Ctx().get(), request, &response).ok());
  const std::vector<pb::WorkItem> items = watch.Await(3);
  ASSERT_EQ(items.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(items[r].rank(), r);
    EXPECT_EQ(items[r].plan_part(), absl::StrCat("part-for-rank-", r));
    EXPECT_EQ(items[r].batched_size(), 0);
  }
  EXPECT_EQ(watch.messages(), 1u);  // one write for the worker's three parts
}

TEST_F(CoordinatorServiceTest, JoinOperationsOverTheMostJoinsPerCallIsRefusedWholeAndJoinsNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string w0 = Register("node0", 10);
  pb::JoinOperationsRequest request;
  for (int r = 0; r <= CoordinatorService::kMaxJoinsPerCall; ++r) {
    *request.add_joins() = JoinRequest(w0, r, CoordinatorService::kMaxJoinsPerCall + 1);
  }
  pb::JoinOperationsResponse response;
  grpc::Status s = stub_->JoinOperations(Ctx().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("joins has 4097 entries, over the bound of 4096"));
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.operations_size(), 0);
}

TEST_F(CoordinatorServiceTest, FailedRankIsStreamedAsAbortToTheOtherWorkerAndNeverCommits) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 2, &j).ok());
  ASSERT_TRUE(Join(w1, 1, 2, &j).ok());
  const std::string op = j.operation().id();
  ASSERT_EQ(watch0.Await(1).size(), 1u);
  ASSERT_TRUE(Report(op, 1, absl::DataLossError("short write to data/1.safetensors")).ok());
  std::vector<pb::WorkItem> items = watch0.Await(2);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].item_case(), pb::WorkItem::kAbort);
  EXPECT_EQ(items[1].abort().code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(items[1].abort().message(), HasSubstr("rank 1 (host node1"));
  EXPECT_THAT(items[1].abort().message(), HasSubstr("short write"));
  EXPECT_EQ(Wait(op).phase(), pb::PHASE_ABORTED);
  EXPECT_TRUE(save_kind_.committed_path.empty());
  // A late report of the other rank is acknowledged (so its worker stops re-sending it) and
  // gets the diagnosis.
  pb::ReportResultRequest request;
  request.set_operation_id(op);
  request.set_rank(0);
  pb::ReportResultResponse late;
  ASSERT_TRUE(stub_->ReportResult(Ctx().get(), request, &late).ok());
  EXPECT_EQ(late.operation().phase(), pb::PHASE_ABORTED);
  EXPECT_EQ(late.operation().status().code(), static_cast<int>(absl::StatusCode::kDataLoss));
}

TEST_F(CoordinatorServiceTest, FailedCommitAbortsWithTheCommittersError) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  save_kind_.commit_result = absl::InternalError("rename of manifest.pb failed");
  std::string w0 = Register("node0", 10);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 1, &j).ok());
  ASSERT_TRUE(Report(j.operation().id(), 0, absl::OkStatus()).ok());
  pb::OperationStatus s = Wait(j.operation().id());
  EXPECT_EQ(s.phase(), pb::PHASE_ABORTED);
  EXPECT_THAT(s.status().message(), HasSubstr("commit failed: rename of manifest.pb failed"));
}

TEST_F(CoordinatorServiceTest, ANegativeArrivalDeadlineIsRefusedNamingTheRankAndStartsNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10);
  pb::JoinOperationResponse j;
  grpc::Status s = Join(w0, 0, 2, &j, /*arrival_deadline_ms=*/-1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("job gpt rank 0: negative arrival_deadline_ms -1"));
  // Nothing was started: the same rank's valid join creates the operation.
  ASSERT_TRUE(Join(w0, 0, 2, &j).ok());
  EXPECT_EQ(j.operation().phase(), pb::PHASE_GATHERING);
}

// Adds to `state`, at piece `index`, a compact f32 "embedding" of 10 elements split flat in
// 2 parts, of which the rank holds `part` (7: a part that does not exist).
void AddCompactEmbedding(pb::RankState* state, int index, int64_t part) {
  pb::CompactTensors* flat = state->add_compact_tensors();
  pb::TensorMeta* tensor = flat->add_tensors();
  tensor->set_key("embedding");
  tensor->set_dtype(pb::DTYPE_F32);
  tensor->add_global_shape(10);
  flat->add_index(index);
  flat->mutable_flat()->set_parts(2);
  flat->mutable_flat()->set_part(part);
}

// A rank's compact tensor (issue 16) is expanded into its pieces before planning; one the
// sharding rules refuse is InvalidArgument to that rank naming it and the tensor.
TEST_F(CoordinatorServiceTest, CompactTensorsAreExpandedAndHostileOnesRefusedNamingRankAndTensor) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10);
  auto join = [&](int rank, int64_t part, pb::JoinOperationResponse* out) {
    pb::JoinOperationRequest request;
    request.set_job("gpt");
    request.set_world_size(2);
    request.set_rank(rank);
    request.set_kind(pb::OPERATION_SAVE);
    request.set_path(checkpoint_path_);
    request.set_worker_id(w0);
    request.mutable_state()->set_rank(rank);
    request.mutable_state()->add_shards()->mutable_tensor()->set_key(absl::StrCat("w", rank));
    AddCompactEmbedding(request.mutable_state(), /*index=*/0, part);
    return stub_->JoinOperation(Ctx().get(), request, out);
  };
  pb::JoinOperationResponse j;
  grpc::Status refused = join(1, /*part=*/7, &j);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("job gpt rank 1: tensor embedding of rank 1"));
  EXPECT_THAT(refused.error_message(), HasSubstr("flat part 7 of 2"));
  ASSERT_TRUE(join(0, 0, &j).ok());
  EXPECT_EQ(j.operation().phase(), pb::PHASE_GATHERING);  // the refused join started nothing
  ASSERT_TRUE(join(1, 1, &j).ok());
  EXPECT_EQ(j.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(save_kind_.planned_shards, 4);  // each rank's listed piece and its expanded one
}

TEST_F(CoordinatorServiceTest, UnregisteredWorkersCannotJoinOrWatch) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  pb::JoinOperationResponse j;
  grpc::Status s = Join("w-42", 0, 1, &j);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("w-42 is not registered"));
  pb::WatchWorkRequest request;
  request.set_worker_id("w-42");
  auto context = Ctx();
  auto reader = stub_->WatchWork(context.get(), request);
  pb::WorkItem item;
  EXPECT_FALSE(reader->Read(&item));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// A coordinator that restarted must never take an id of its predecessor for one of its own:
// worker and operation ids carry the incarnation, and the old ids are refused with statuses
// that make a worker register again (heartbeat, work stream) or drop a result nobody awaits.
TEST_F(CoordinatorServiceTest, IdsOfAnEarlierIncarnationAreRefusedByTheNextOne) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const uint64_t first = service_->incarnation();
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 1, &j).ok());
  const std::string old_op = j.operation().id();
  EXPECT_THAT(w0, HasSubstr(service_->incarnation_hex()));
  EXPECT_THAT(old_op, HasSubstr(service_->incarnation_hex()));
  // The coordinator restarts: a new process, a new incarnation, the same address.
  TearDown();
  ASSERT_NO_FATAL_FAILURE(StartServer());
  EXPECT_NE(service_->incarnation(), first);
  // The workers register in the other order: no new id equals an old one.
  std::string n1 = Register("node1", 11), n0 = Register("node0", 10);
  for (const std::string& fresh : {n0, n1}) {
    EXPECT_NE(fresh, w0);
    EXPECT_NE(fresh, w1);
  }
  pb::HeartbeatRequest beat;
  beat.set_worker_id(w0);
  pb::HeartbeatResponse beat_response;
  grpc::Status refused = stub_->Heartbeat(Ctx().get(), beat, &beat_response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(refused.error_message(), HasSubstr("register again"));
  beat.set_worker_id(n0);
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), beat, &beat_response).ok());
  EXPECT_EQ(beat_response.incarnation(), service_->incarnation());
  // The first operation of the new coordinator is not the old one.
  ASSERT_TRUE(Join(n0, 0, 1, &j).ok());
  EXPECT_NE(j.operation().id(), old_op);
  grpc::Status stale = Report(old_op, 0, absl::OkStatus());
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(stale.error_message(), HasSubstr(service_->incarnation_hex()));
  Watcher watch(stub_.get(), n0);
  std::vector<pb::WorkItem> items = watch.Await(1);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].incarnation(), service_->incarnation());
}

TEST_F(CoordinatorServiceTest, NcclIsRecordedOnlyForAWorkerThatServesAGpu) {
  StartServer();
  for (int gpu : {0, -1}) {
    pb::RegisterWorkerRequest request;
    request.mutable_info()->set_host("node0");
    request.mutable_info()->set_pid(100 + gpu);
    request.mutable_info()->set_gpu(gpu);
    request.mutable_info()->set_nccl(true);
    pb::RegisterWorkerResponse response;
    ASSERT_TRUE(stub_->RegisterWorker(Ctx().get(), request, &response).ok());
  }
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.workers_size(), 2);
  for (const pb::WorkerStatus& w : status.workers()) {
    // A worker without a GPU cannot create an NCCL communicator, whatever it says.
    EXPECT_EQ(w.info().nccl(), w.info().gpu() >= 0) << w.info().ShortDebugString();
  }
}

// The threads of this process (the test's clients and the server), from /proc/self/status.
int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// Calls of many workers and ranks at once, made with the async client API (so the client
// side holds no thread per call either), over several connections.
class ManyCalls {
 public:
  ManyCalls(const std::string& address, int channels) {
    for (int i = 0; i < channels; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("ckpt.test_connection", i);  // a connection each, not one shared
      stubs_.push_back(pb::Coordinator::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
    }
  }
  ~ManyCalls() {
    for (auto& c : contexts_) c->TryCancel();
    Drain();
  }
  // Opens worker `worker_id`'s WatchWork stream.
  void Watch(const std::string& worker_id) {
    pb::WatchWorkRequest request;
    request.set_worker_id(worker_id);
    grpc::ClientContext* context = NewContext();
    streams_.push_back(Stub()->AsyncWatchWork(context, request, &cq_, NewTag()));
  }
  // Starts a WaitOperation on `operation_id` with `timeout_ms`.
  void Wait(const std::string& operation_id, int64_t timeout_ms) {
    pb::WaitOperationRequest request;
    request.set_operation_id(operation_id);
    request.set_timeout_ms(timeout_ms);
    grpc::ClientContext* context = NewContext();
    waits_.push_back(Stub()->AsyncWaitOperation(context, request, &cq_));
    statuses_.push_back(std::make_unique<grpc::Status>());
    responses_.push_back(std::make_unique<pb::OperationStatus>());
    waits_.back()->Finish(responses_.back().get(), statuses_.back().get(), NewTag());
  }
  // Cancels every call; the server must let go of each one.
  void CancelAll() {
    for (auto& c : contexts_) c->TryCancel();
  }

 private:
  pb::Coordinator::Stub* Stub() { return stubs_[contexts_.size() % stubs_.size()].get(); }
  grpc::ClientContext* NewContext() {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    contexts_.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    return contexts_.back().get();
  }
  void* NewTag() { return reinterpret_cast<void*>(++tags_); }
  // Collects the completion of every call started (the stream starts and the waits).
  void Drain() {
    void* tag = nullptr;
    bool ok = false;
    for (int64_t i = 0; i < tags_ && cq_.Next(&tag, &ok); ++i) {
    }
    for (auto& stream : streams_) {
      grpc::Status ignored;
      stream->Finish(&ignored, NewTag());
      cq_.Next(&tag, &ok);
    }
    cq_.Shutdown();
    while (cq_.Next(&tag, &ok)) {
    }
  }

  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<pb::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<pb::WorkItem>>> streams_;
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<pb::OperationStatus>>> waits_;
  std::vector<std::unique_ptr<grpc::Status>> statuses_;
  std::vector<std::unique_ptr<pb::OperationStatus>> responses_;
  int64_t tags_ = 0;
};

// Waits (bounded) until `done` holds; the server registers calls on its own threads.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Issue 16: the sync server held a thread per open WatchWork stream and per waiting
// WaitOperation (~2 per rank). 500 workers each watching, and 500 ranks each waiting, must
// leave the process's thread count flat; cancelling the calls must free the server's side.
TEST_F(CoordinatorServiceTest, FiveHundredWatchersAndWaitersHoldNoThreadEach) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kWorkers = 500;
  std::vector<std::string> workers;
  for (int i = 0; i < kWorkers; ++i) workers.push_back(Register(absl::StrCat("node", i), i + 1));
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(workers[0], 0, kWorkers + 1, &j).ok());  // gathers until rank 500 joins
  const std::string op = j.operation().id();
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  const int threads_before = ProcessThreads();
  {
    ManyCalls calls(address_, 8);
    for (const std::string& w : workers) calls.Watch(w);
    for (int r = 0; r < kWorkers; ++r) calls.Wait(op, 60'000);
    ASSERT_TRUE(Eventually([&] {
      return service_->open_watchers() == kWorkers && service_->open_waits() == kWorkers;
    })) << service_->open_watchers()
        << " streams, " << service_->open_waits() << " waits";
    const int threads = ProcessThreads();
    EXPECT_LT(threads, 64) << "before the calls: " << threads_before;
    calls.CancelAll();
    EXPECT_TRUE(Eventually([&] {
      return service_->open_watchers() == 0 && service_->open_waits() == 0;
    })) << service_->open_watchers()
        << " streams, " << service_->open_waits() << " waits";
  }
}

TEST_F(CoordinatorServiceTest, WaitEndsAtItsDeadlineWithTheCurrentPhase) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 2, &j).ok());
  pb::WaitOperationRequest request;
  request.set_operation_id(j.operation().id());
  request.set_timeout_ms(150);
  pb::OperationStatus status;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(stub_->WaitOperation(Ctx().get(), request, &status).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_EQ(status.phase(), pb::PHASE_GATHERING);
  request.set_operation_id("op-unknown");
  grpc::Status unknown = stub_->WaitOperation(Ctx().get(), request, &status);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("op-unknown is unknown to this coordinator"));
}

// A heartbeat states the timeout it was sent with; what is gone of it when the handler runs is
// the coordinator's own queueing delay, by which leases are extended (at most one lease).
TEST_F(CoordinatorServiceTest, AHeartbeatThatWaitedForItsHandlerExtendsLeasesByTheLag) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string worker = Register("node0", 10);
  pb::HeartbeatRequest beat;
  beat.set_worker_id(worker);
  pb::HeartbeatResponse response;
  beat.set_timeout_ms(10000);  // what Ctx() sets: answered at once, no lag
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), beat, &response).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  EXPECT_LT(status.heartbeat_lag_ms(), 1000);
  // A call that arrives with 10 s left of a stated 25 s waited ~15 s before its handler.
  beat.set_timeout_ms(25000);
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), beat, &response).ok());
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  EXPECT_GE(status.heartbeat_lag_ms(), 14000);
  EXPECT_LE(status.heartbeat_lag_ms(), 15000);
  // A stated lag beyond the lease (30 s here) extends leases by one lease at most.
  beat.set_timeout_ms(3600 * 1000);
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), beat, &response).ok());
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.heartbeat_lag_ms(), 30000);
  // An unknown worker's heartbeat counts for nothing.
  beat.set_worker_id("w-nobody-1");
  EXPECT_FALSE(stub_->Heartbeat(Ctx().get(), beat, &response).ok());
}

TEST_F(CoordinatorServiceTest, ShutdownEndsOpenStreamsAndWaitsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(Join(w0, 0, 2, &j).ok());
  pb::WatchWorkRequest watch;
  watch.set_worker_id(w0);
  grpc::ClientContext watch_context;  // no deadline: only the shutdown ends it
  auto reader = stub_->WatchWork(&watch_context, watch);
  pb::OperationStatus status;
  grpc::Status waited;
  std::thread waiter([&] {
    pb::WaitOperationRequest request;
    request.set_operation_id(j.operation().id());
    request.set_timeout_ms(3'600'000);
    grpc::ClientContext context;
    waited = stub_->WaitOperation(&context, request, &status);
  });
  ASSERT_TRUE(
      Eventually([&] { return service_->open_watchers() == 1 && service_->open_waits() == 1; }));
  service_->Shutdown();
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_EQ(status.phase(), pb::PHASE_GATHERING);
  pb::WorkItem item;
  ASSERT_TRUE(reader->Read(&item));  // the stream's opening mark, then nothing
  EXPECT_TRUE(item.stream_opened());
  EXPECT_FALSE(reader->Read(&item));
  grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(ended.error_message(), HasSubstr("shutting down"));
}

TEST(CoordinatorServiceConversionTest, OperationKindsRoundTrip) {
  EXPECT_EQ(*FromProto(ToProto(OperationKind::kReshard)), OperationKind::kReshard);
  EXPECT_FALSE(FromProto(pb::OPERATION_KIND_UNSPECIFIED).ok());
}

// A rank's state description of `pieces` pieces (keys r<rank>.<i>).
pb::RankState Described(int rank, int pieces) {
  pb::RankState state;
  state.set_rank(rank);
  for (int i = 0; i < pieces; ++i) {
    state.add_shards()->mutable_tensor()->set_key(absl::StrCat("r", rank, ".", i));
  }
  return state;
}

// Issue 16: a repeat save whose ranks send only their description's digest skips the gather.
class CoordinatorDigestTest : public CoordinatorServiceTest {
 protected:
  // A join with `state` in full (and its digest), or only its digest when `omit_state`.
  grpc::Status JoinDescribed(const std::string& worker, int rank, const pb::RankState& state,
                             bool omit_state, pb::JoinOperationResponse* out,
                             const std::string& digest_override = "") {
    pb::JoinOperationRequest request;
    request.set_job("gpt");
    request.set_world_size(2);
    request.set_rank(rank);
    request.set_kind(pb::OPERATION_SAVE);
    request.set_path(checkpoint_path_);
    request.set_worker_id(worker);
    request.set_state_digest(digest_override.empty() ? DescriptionDigest(state) : digest_override);
    request.set_state_omitted(omit_state);
    if (!omit_state) *request.mutable_state() = state;
    return stub_->JoinOperation(Ctx().get(), request, out);
  }
  // Reports both ranks done and waits for the commit.
  void Finish(const std::string& op) {
    ASSERT_TRUE(Report(op, 0, absl::OkStatus()).ok());
    ASSERT_TRUE(Report(op, 1, absl::OkStatus()).ok());
    ASSERT_EQ(Wait(op).phase(), pb::PHASE_DONE);
  }
};

TEST_F(CoordinatorDigestTest, ARepeatJoinWithAnUnchangedDescriptionSendsOnlyItsDigest) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), false, &j).ok());
  EXPECT_TRUE(j.state_kept());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), false, &j).ok());
  EXPECT_TRUE(j.state_kept());
  EXPECT_EQ(j.operation().ranks_described_by_digest(), 0);
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));
  save_kind_.planned_shards = 0;

  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j).ok());
  EXPECT_FALSE(j.send_full_state());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), true, &j).ok());
  EXPECT_FALSE(j.send_full_state());
  EXPECT_EQ(j.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(j.operation().ranks_described_by_digest(), 2);
  EXPECT_EQ(save_kind_.planned_shards, 5);  // planned over the kept descriptions
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));
}

// A compact description (issue 16) is kept expanded under the digest of what the rank sent:
// the digest-only repeat join plans the expanded pieces without the rank sending them again.
TEST_F(CoordinatorDigestTest, ACompactDescriptionIsKeptExpandedUnderTheDigestOfWhatWasSent) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  auto compact = [](int rank) {
    pb::RankState state = Described(rank, 1);
    AddCompactEmbedding(&state, /*index=*/1, /*part=*/rank);
    return state;
  };
  pb::JoinOperationResponse j;
  ASSERT_TRUE(JoinDescribed(w0, 0, compact(0), false, &j).ok());
  EXPECT_TRUE(j.state_kept());
  ASSERT_TRUE(JoinDescribed(w1, 1, compact(1), false, &j).ok());
  EXPECT_EQ(save_kind_.planned_shards, 4);  // each rank's listed piece and its expanded one
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));
  save_kind_.planned_shards = 0;

  ASSERT_TRUE(JoinDescribed(w0, 0, compact(0), true, &j).ok());
  EXPECT_FALSE(j.send_full_state()) << j.send_full_state_reason();
  ASSERT_TRUE(JoinDescribed(w1, 1, compact(1), true, &j).ok());
  EXPECT_FALSE(j.send_full_state()) << j.send_full_state_reason();
  EXPECT_EQ(j.operation().ranks_described_by_digest(), 2);
  EXPECT_EQ(save_kind_.planned_shards, 4);  // the kept expansion, not the compact form
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));
}

TEST_F(CoordinatorDigestTest, ACoordinatorKeepingNoDescriptionsHasEveryJoinSendItsFullState) {
  ASSERT_NO_FATAL_FAILURE(StartServer(/*description_cache_bytes=*/0));
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), false, &j).ok());
  EXPECT_FALSE(j.state_kept());  // so the worker never omits it
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), false, &j).ok());
  EXPECT_FALSE(j.state_kept());
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));
  // A worker that omits its state anyway is told to send it.
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j).ok());
  EXPECT_TRUE(j.send_full_state());
}

TEST_F(CoordinatorDigestTest, AMismatchedDigestIsRefusedWithTheSendFullStateAnswer) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j;
  // Nothing kept yet: an unknown digest is refused too.
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j).ok());
  EXPECT_TRUE(j.send_full_state());
  EXPECT_THAT(j.send_full_state_reason(), HasSubstr("job gpt rank 0"));
  EXPECT_FALSE(j.has_operation());
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), false, &j).ok());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), false, &j).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));

  // A digest the coordinator did not compute for what it keeps (a rank claiming another
  // description's digest) is refused: nothing is joined.
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j, std::string(32, 'x')).ok());
  EXPECT_TRUE(j.send_full_state());
  EXPECT_THAT(j.send_full_state_reason(), HasSubstr("send the full description"));
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), true, &j).ok());
  EXPECT_FALSE(j.send_full_state());
  EXPECT_EQ(j.operation().joined_ranks(), 1);  // rank 0's refused join did not count
  EXPECT_EQ(j.operation().phase(), pb::PHASE_GATHERING);
}

// Issue 16: ranks of different data-parallel replicas describe their pieces by reference to the
// layout class they share (JoinOperationRequest.piece_list); one rank per class is asked for it
// in full.
class CoordinatorClassTest : public CoordinatorDigestTest {
 protected:
  // Rank `rank`'s description: the same two pieces on every rank (one layout class), replica
  // id = rank, and a flat range of its own.
  static pb::RankState Replica(int rank) {
    pb::RankState state;
    state.set_rank(rank);
    for (int i = 0; i < 2; ++i) {
      pb::PieceMeta* p = state.add_shards();
      p->mutable_tensor()->set_key(absl::StrCat("t", i));
      p->mutable_tensor()->set_dtype(pb::DTYPE_F32);
      p->mutable_tensor()->add_global_shape(8);
      p->mutable_region()->add_offsets(0);
      p->mutable_region()->add_lengths(8);
      p->add_replica_id(i == 0 ? rank : 0);
      if (i == 1) {
        p->mutable_region()->mutable_flat()->set_start(4 * rank);
        p->mutable_region()->mutable_flat()->set_stop(4 * rank + 4);
      }
    }
    return state;
  }
  // Rank `rank`'s join of `state`: by reference to its class, or in full.
  pb::JoinOperationRequest ClassJoin(const std::string& worker, int rank,
                                     const pb::RankState& state, bool by_reference) {
    pb::JoinOperationRequest request;
    request.set_job("gpt");
    request.set_world_size(2);
    request.set_rank(rank);
    request.set_kind(pb::OPERATION_SAVE);
    request.set_path(checkpoint_path_);
    request.set_worker_id(worker);
    absl::StatusOr<DescriptionSplit> split = SplitDescription(state);
    EXPECT_TRUE(split.ok()) << split.status();
    request.set_state_digest(split->digest);
    if (!by_reference) {
      *request.mutable_state() = state;
      return request;
    }
    request.set_state_omitted(true);
    request.mutable_state()->set_rank(rank);
    request.mutable_piece_list()->set_class_digest(split->class_digest);
    *request.mutable_piece_list()->mutable_column() = split->column;
    return request;
  }
  // One JoinOperations call of `join`; its one result.
  pb::JoinResult JoinCall(const pb::JoinOperationRequest& join) {
    pb::JoinOperationsRequest request;
    *request.add_joins() = join;
    pb::JoinOperationsResponse response;
    grpc::Status s = stub_->JoinOperations(Ctx().get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.results_size() == 1 ? response.results(0) : pb::JoinResult();
  }
};

TEST_F(CoordinatorClassTest, OneRankDescribesTheClassInFullAndTheOtherJoinsByReference) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinResult r = JoinCall(ClassJoin(w0, 0, Replica(0), true));
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  EXPECT_TRUE(r.response().send_full_state());  // the first rank is asked for the class
  EXPECT_THAT(r.response().send_full_state_reason(), HasSubstr("does not hold layout class"));
  r = JoinCall(ClassJoin(w0, 0, Replica(0), false));
  ASSERT_FALSE(r.response().send_full_state());
  EXPECT_TRUE(r.response().state_kept());
  r = JoinCall(ClassJoin(w1, 1, Replica(1), true));  // the class is held now
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  ASSERT_FALSE(r.response().send_full_state()) << r.response().send_full_state_reason();
  EXPECT_TRUE(r.response().state_kept());
  const std::string op = r.response().operation().id();
  // The plan (made before the call that completed the gather was answered) saw rank 1's own replica
  // ids and flat range, rebuilt from the class.
  ASSERT_EQ(save_kind_.planned_pieces.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const pb::RankState expected = Replica(rank);
    ASSERT_EQ(save_kind_.planned_pieces[rank].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(save_kind_.planned_pieces[rank][i].SerializeAsString(),
                expected.shards(i).SerializeAsString())
          << "rank " << rank << " piece " << i;
    }
  }
  ASSERT_NO_FATAL_FAILURE(Finish(op));
  // The description a reference kept answers a digest-only repeat join.
  pb::JoinOperationResponse j;
  ASSERT_TRUE(JoinDescribed(w1, 1, Replica(1), true, &j).ok());
  EXPECT_FALSE(j.send_full_state()) << j.send_full_state_reason();
}

// A call naming a class that another call's rank was asked for waits for it (ordered by the
// service's own count of parked calls), then joins by reference.
TEST_F(CoordinatorClassTest, ACallWaitsForTheClassAnotherRankWasAskedFor) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  ASSERT_TRUE(JoinCall(ClassJoin(w0, 0, Replica(0), true)).response().send_full_state());
  pb::JoinResult waited;
  std::thread waiter([&] { waited = JoinCall(ClassJoin(w1, 1, Replica(1), true)); });
  ASSERT_TRUE(Eventually([&] { return service_->parked_join_calls() == 1; }));
  EXPECT_FALSE(JoinCall(ClassJoin(w0, 0, Replica(0), false)).response().send_full_state());
  waiter.join();
  EXPECT_EQ(service_->parked_join_calls(), 0);
  ASSERT_EQ(waited.status().code(), 0) << waited.status().message();
  EXPECT_FALSE(waited.response().send_full_state()) << waited.response().send_full_state_reason();
  EXPECT_EQ(waited.response().operation().joined_ranks(), 2);
}

// The rank asked for the class never sends it: the waiting call is answered send_full_state
// once --piece_list_wait passes, and its rank joins in full.
TEST_F(CoordinatorClassTest, AWaitForAClassThatNeverComesEndsWithSendFullState) {
  piece_list_wait_ = absl::Milliseconds(300);
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  ASSERT_TRUE(JoinCall(ClassJoin(w0, 0, Replica(0), true)).response().send_full_state());
  const absl::Time start = absl::Now();
  pb::JoinResult r = JoinCall(ClassJoin(w1, 1, Replica(1), true));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_TRUE(r.response().send_full_state());
  r = JoinCall(ClassJoin(w1, 1, Replica(1), false));
  EXPECT_FALSE(r.response().send_full_state());
  EXPECT_EQ(r.response().operation().joined_ranks(), 1);
}

// However long --piece_list_wait, a call parked for a class is answered (send_full_state) with
// half of its deadline left, so the worker hears why before its call times out.
TEST_F(CoordinatorClassTest, AWaitForAClassEndsWellBeforeTheCallsDeadline) {
  piece_list_wait_ = absl::Minutes(10);
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  ASSERT_TRUE(JoinCall(ClassJoin(w0, 0, Replica(0), true)).response().send_full_state());
  pb::JoinOperationsRequest request;
  *request.add_joins() = ClassJoin(w1, 1, Replica(1), true);
  pb::JoinOperationsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(4)));
  grpc::Status s = stub_->JoinOperations(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_TRUE(response.results(0).response().send_full_state());
  EXPECT_EQ(service_->parked_join_calls(), 0);
}

// A worker's rank asked for the class re-sends it in full in the same call as another rank of
// that class joining by reference (listed first): the call is not parked (it would wait for
// itself until --piece_list_wait, past the worker's RPC deadline), and the reference finds the
// class the call brings.
TEST_F(CoordinatorClassTest, ACallBringingAClassInFullIsNotParkedAndItsReferencesUseIt) {
  piece_list_wait_ = absl::Minutes(10);
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10);
  Watcher watch0(stub_.get(), w0);
  ASSERT_TRUE(JoinCall(ClassJoin(w0, 0, Replica(0), true)).response().send_full_state());
  pb::JoinOperationsRequest request;
  *request.add_joins() = ClassJoin(w0, 1, Replica(1), true);
  *request.add_joins() = ClassJoin(w0, 0, Replica(0), false);
  pb::JoinOperationsResponse response;
  grpc::Status s = stub_->JoinOperations(Ctx().get(), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(response.results_size(), 2);
  EXPECT_EQ(service_->parked_join_calls(), 0);
  for (int i = 0; i < 2; ++i) {
    const pb::JoinResult& r = response.results(i);
    ASSERT_EQ(r.status().code(), 0) << i << ": " << r.status().message();
    EXPECT_FALSE(r.response().send_full_state())
        << i << ": " << r.response().send_full_state_reason();
    EXPECT_TRUE(r.response().state_kept()) << i;
  }
  EXPECT_EQ(response.results(1).response().operation().joined_ranks(), 2);
}

TEST_F(CoordinatorClassTest, AMalformedReferenceIsRefusedNamingJobAndRank) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  ASSERT_TRUE(JoinCall(ClassJoin(w0, 0, Replica(0), true)).response().send_full_state());
  ASSERT_FALSE(JoinCall(ClassJoin(w0, 0, Replica(0), false)).response().send_full_state());
  pb::JoinOperationRequest bad = ClassJoin(w1, 1, Replica(1), true);
  bad.mutable_piece_list()->mutable_column()->set_replica_of_piece(0, 7);
  pb::JoinResult r = JoinCall(bad);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("job gpt rank 1"));
  EXPECT_THAT(r.status().message(), HasSubstr("replica id 7"));
  bad = ClassJoin(w1, 1, Replica(1), true);
  *bad.mutable_state()->add_shards() = Replica(1).shards(0);  // pieces beside a reference
  r = JoinCall(bad);
  EXPECT_EQ(r.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("carries only the rank"));
  bad = ClassJoin(w1, 1, Replica(1), true);
  bad.set_state_omitted(false);
  EXPECT_THAT(JoinCall(bad).status().message(), HasSubstr("sets state_omitted"));
  // A reference to a class of another job is not held for this one.
  bad = ClassJoin(w1, 1, Replica(1), true);
  bad.set_job("other");
  EXPECT_TRUE(JoinCall(bad).response().send_full_state());
}

TEST_F(CoordinatorDigestTest, ARankWithAChangedLayoutSendsItInFullAndThePlanIsRebuilt) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::string w0 = Register("node0", 10), w1 = Register("node1", 11);
  Watcher watch0(stub_.get(), w0), watch1(stub_.get(), w1);
  pb::JoinOperationResponse j;
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), false, &j).ok());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 3), false, &j).ok());
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));

  // Rank 1's layout changed: its digest no longer matches the kept one.
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j).ok());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 7), true, &j).ok());
  EXPECT_TRUE(j.send_full_state());
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 7), false, &j).ok());
  EXPECT_EQ(j.operation().phase(), pb::PHASE_EXECUTING);
  EXPECT_EQ(j.operation().ranks_described_by_digest(), 1);
  EXPECT_EQ(save_kind_.planned_shards, 9);  // replanned over the new description
  ASSERT_NO_FATAL_FAILURE(Finish(j.operation().id()));

  // The new description is the one kept from now on.
  ASSERT_TRUE(JoinDescribed(w1, 1, Described(1, 7), true, &j).ok());
  EXPECT_FALSE(j.send_full_state());
  ASSERT_TRUE(JoinDescribed(w0, 0, Described(0, 2), true, &j).ok());
  EXPECT_EQ(j.operation().ranks_described_by_digest(), 2);
  EXPECT_EQ(save_kind_.planned_shards, 9);
}

// A restarted coordinator takes a persistence in flight from a worker's report; the target in
// that report passes the checks a saving rank's persist_to passes. A report naming a directory
// outside the checkpoint roots fails the persistence, naming it, and nothing is written there.
TEST_F(CoordinatorServiceTest, ARecoveredPersistenceOutsideTheCheckpointRootsFailsNamingIt) {
  MemoryCatalog catalog;
  PersistDriver driver(&catalog, 2);
  ASSERT_NO_FATAL_FAILURE(StartServer(int64_t{2} << 30, [&](CoordinatorService& service) {
    service.set_memory_catalog(&catalog);
    service.set_persist_driver(&driver);
  }));
  const std::string outside = "/var/tmp/ckpt-hostile-persist-target";
  MemoryCheckpoint reported;
  reported.name = "s";
  reported.committed = absl::FromUnixMillis(1000);
  reported.manifest.add_files()->set_name("data/r0_0.safetensors");
  reported.persist_to = outside;
  reported.persist_overwrite = true;
  pb::RegisterWorkerRequest request;
  request.mutable_info()->set_host("a");
  request.mutable_info()->set_pid(7);
  pb::HeldMemoryCheckpoint* held = request.add_memory_held();
  held->set_name("s");
  held->add_files("data/r0_0.safetensors");
  held->set_complete(true);
  held->set_pinned(true);
  *held->mutable_record() = RecordOf(reported);
  pb::RegisterWorkerResponse response;
  ASSERT_TRUE(stub_->RegisterWorker(Ctx().get(), request, &response).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.memory_checkpoints_size(), 1) << status.DebugString();
  const std::string& persist = status.memory_checkpoints(0).persist();
  EXPECT_THAT(persist, HasSubstr("failed")) << persist;
  EXPECT_THAT(persist, HasSubstr(outside)) << persist;
  EXPECT_THAT(persist, HasSubstr("checkpoint root")) << persist;
  struct stat st;
  EXPECT_NE(stat(outside.c_str(), &st), 0) << outside << " was created";
}

// A published version rebuilt from a worker's report carries a name a receive's path can name,
// or it is not listed: "a@b" and "x/y" would stand for other paths or none.
TEST_F(CoordinatorServiceTest, ReportedPublishedVersionsUnderHostileNamesAreNotListed) {
  MemoryCatalog catalog;
  PublishedRegistry published;
  ASSERT_NO_FATAL_FAILURE(StartServer(int64_t{2} << 30, [&](CoordinatorService& service) {
    service.set_memory_catalog(&catalog);
    service.set_published_registry(&published);
  }));
  pb::RegisterWorkerRequest request;
  request.mutable_info()->set_host("a");
  request.mutable_info()->set_pid(7);
  int n = 0;
  for (const std::string& name :
       std::vector<std::string>{"policy", "a@b", "x/y", std::string(1000, 'p')}) {
    MemoryCheckpoint reported;
    reported.name = absl::StrCat("held", n++);
    reported.committed = absl::FromUnixMillis(1000);
    reported.manifest.add_files()->set_name("data/r0_0.safetensors");
    reported.published_name = name;
    reported.published_version = 1;
    pb::HeldMemoryCheckpoint* held = request.add_memory_held();
    held->set_name(reported.name);
    held->add_files("data/r0_0.safetensors");
    held->set_complete(true);
    *held->mutable_record() = RecordOf(reported);
  }
  pb::RegisterWorkerResponse response;
  ASSERT_TRUE(stub_->RegisterWorker(Ctx().get(), request, &response).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.published_size(), 1) << status.DebugString();
  EXPECT_EQ(status.published(0).name(), "policy");
}

// Every line the coordinator logs while it lives (spdlog's default logger).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100000)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::vector<std::string> Lines() { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

TEST_F(CoordinatorServiceTest, AHostNameOverItsBoundIsRefusedNamingItAndNeitherStoredNorLogged) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  LogCapture log;
  pb::RegisterWorkerRequest request;
  request.mutable_info()->set_host(std::string(2 << 20, 'h'));  // 2 MiB (issue 39: 200 MiB)
  request.mutable_info()->set_pid(7);
  pb::RegisterWorkerResponse response;
  grpc::Status s = stub_->RegisterWorker(Ctx().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("RegisterWorker: info.host is 2097152 bytes, over the bound of 255"));
  EXPECT_THAT(s.error_message(), HasSubstr("caller: unauthenticated caller"));
  EXPECT_LT(s.error_message().size(), 1024u);
  request.mutable_info()->set_host(std::string(kMaxHostBytes, 'h'));  // the bound itself
  EXPECT_TRUE(stub_->RegisterWorker(Ctx().get(), request, &response).ok());
  pb::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), pb::GetStatusRequest(), &status).ok());
  ASSERT_EQ(status.workers_size(), 1);  // only the one within the bound
  EXPECT_EQ(status.workers(0).info().host().size(), kMaxHostBytes);
  const std::vector<std::string> lines = log.Lines();
  EXPECT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_LT(line.size(), 2048u) << line.substr(0, 200);
  }
}

TEST_F(CoordinatorServiceTest, OneIdentityHoldsAtMostItsQuotaOfWorkersAndJobs) {
  options_hook_ = [](CoordinatorOptions& options) {
    options.max_workers_per_identity = 3;
    options.max_jobs_per_identity = 2;
  };
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::vector<std::string> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(Register(absl::StrCat("node", i), 10 + i));
  pb::RegisterWorkerRequest fourth;
  fourth.mutable_info()->set_host("node3");
  fourth.mutable_info()->set_pid(13);
  pb::RegisterWorkerResponse registered;
  grpc::Status s = stub_->RegisterWorker(Ctx().get(), fourth, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("ipv4:127.0.0.1 holds 3 registered workers"));
  EXPECT_THAT(s.error_message(), HasSubstr("--max_workers_per_identity=3"));
  EXPECT_EQ(Register("node1", 11), workers[1]);  // registering again is no new worker
  pb::DeregisterWorkerRequest leave;
  leave.set_worker_id(workers[2]);
  pb::DeregisterWorkerResponse left;
  ASSERT_TRUE(stub_->DeregisterWorker(Ctx().get(), leave, &left).ok());
  EXPECT_TRUE(stub_->RegisterWorker(Ctx().get(), fourth, &registered).ok());

  auto attach = [&](const std::string& job) {
    pb::AttachRankRequest a;
    a.set_job(job);
    a.set_world_size(1);
    a.set_rank(0);
    a.set_worker_id(workers[0]);
    pb::AttachRankResponse ignored;
    return stub_->AttachRank(Ctx().get(), a, &ignored);
  };
  ASSERT_TRUE(attach("a").ok());
  ASSERT_TRUE(attach("b").ok());
  s = attach("c");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("created 2 jobs that have ranks"));
  EXPECT_THAT(s.error_message(), HasSubstr("--max_jobs_per_identity=2"));
  pb::JoinOperationResponse joined;
  pb::JoinOperationRequest join = JoinRequest(workers[0], 0, 1);
  join.set_job("c");
  EXPECT_EQ(stub_->JoinOperation(Ctx().get(), join, &joined).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  pb::DetachRankRequest detach;  // job a ends: c fits
  detach.set_job("a");
  detach.set_rank(0);
  detach.set_worker_id(workers[0]);
  pb::DetachRankResponse detached;
  ASSERT_TRUE(stub_->DetachRank(Ctx().get(), detach, &detached).ok());
  EXPECT_TRUE(attach("c").ok());
}

TEST_F(CoordinatorServiceTest, ANewerWatchWorkStreamReplacesTheOlderOneOfTheSameWorker) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string w = Register("node0", 10);
  pb::WatchWorkRequest request;
  request.set_worker_id(w);
  auto first_context = Ctx();
  std::unique_ptr<grpc::ClientReader<pb::WorkItem>> first =
      stub_->WatchWork(first_context.get(), request);
  pb::WorkItem item;
  ASSERT_TRUE(first->Read(&item));
  EXPECT_TRUE(item.stream_opened());
  {
    Watcher second(stub_.get(), w);
    EXPECT_EQ(second.AwaitOpened(), 1);
    while (first->Read(&item)) {
    }
    grpc::Status ended = first->Finish();
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::ABORTED) << ended.error_message();
    EXPECT_THAT(ended.error_message(), HasSubstr("newer WatchWork stream for worker " + w));
    EXPECT_TRUE(Eventually([&] { return service_->open_watchers() == 1; }))
        << service_->open_watchers();
  }
  EXPECT_TRUE(Eventually([&] { return service_->open_watchers() == 0; }));
}

TEST_F(CoordinatorServiceTest, StatusComesInBoundedPagesThatTogetherListEverything) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kWorkers = 30;
  constexpr int kRanks = 250;
  std::vector<std::string> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(Register(absl::StrCat(std::string(200, 'n'), i), i + 1));
  }
  for (int r = 0; r < kRanks; ++r) {
    pb::AttachRankRequest a;
    a.set_job("big");
    a.set_world_size(kRanks);
    a.set_rank(r);
    a.set_worker_id(workers[r % kWorkers]);
    pb::AttachRankResponse ignored;
    ASSERT_TRUE(stub_->AttachRank(Ctx().get(), a, &ignored).ok());
  }
  pb::GetStatusRequest request;
  request.set_page_size(100);
  std::set<std::string> listed_workers;
  std::vector<int> ranks;
  int pages = 0;
  do {
    pb::GetStatusResponse page;
    ASSERT_TRUE(stub_->GetStatus(Ctx().get(), request, &page).ok());
    ASSERT_LT(++pages, 10);
    int entries = page.workers_size();
    for (const pb::WorkerStatus& w : page.workers()) listed_workers.insert(w.worker_id());
    for (const pb::JobStatus& job : page.jobs()) {
      EXPECT_EQ(job.name(), "big");
      entries += 1 + job.ranks_size();
      for (const pb::RankAttachment& a : job.ranks()) ranks.push_back(a.rank());
    }
    EXPECT_LE(entries, 101) << "page " << pages;  // page_size, plus a continued job's name
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  EXPECT_EQ(pages, 3);  // 30 workers + 1 job + 250 ranks in pages of 100
  EXPECT_EQ(listed_workers.size(), static_cast<size_t>(kWorkers));
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(ranks[r], r);

  request.set_page_token("9.9.9");  // not one it hands out
  pb::GetStatusResponse refused;
  EXPECT_EQ(stub_->GetStatus(Ctx().get(), request, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request.set_page_token("");
  request.set_page_size(kMaxStatusPageItems + 1);
  EXPECT_EQ(stub_->GetStatus(Ctx().get(), request, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace ckpt::coordinator
