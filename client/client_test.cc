// Client against a worker peer that is a real ckpt.pb.Worker gRPC service on a unix socket (the
// transport trainers use): what the client sends for Hello, Save, Load and Poll, and how it turns
// the worker's answers (snapshot, done, aborted, still running) into its results.
#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"

namespace ckpt::client {
namespace {

// The worker peer: answers Hello with a session, records every request, answers Wait with the
// response a test sets (waiting up to the request's timeout for one to be set, as the real
// worker waits for a change), and Poll with the pending operation a test sets.
class FakeWorker final : public pb::Worker::Service {
 public:
  grpc::Status Hello(grpc::ServerContext*, const pb::TrainerHello* request,
                     pb::TrainerHelloResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    hellos.push_back(*request);
    response->set_worker_id("w-test-0");
    response->set_session_id("session-1");
    response->set_host("fakehost");
    return grpc::Status::OK;
  }
  grpc::Status RegisterTensors(grpc::ServerContext*, const pb::RegisterTensorsRequest* request,
                               pb::RegisterTensorsResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    registrations.push_back(*request);
    return grpc::Status::OK;
  }
  grpc::Status Save(grpc::ServerContext*, const pb::TransferRequest* request,
                    pb::TransferResponse* response) override {
    return Transfer(*request, response, &saves);
  }
  grpc::Status Load(grpc::ServerContext*, const pb::TransferRequest* request,
                    pb::TransferResponse* response) override {
    return Transfer(*request, response, &loads);
  }
  grpc::Status Poll(grpc::ServerContext*, const pb::PollRequest*,
                    pb::PollResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    *response = pending_;
    pending_ = pb::PollResponse();
    return grpc::Status::OK;
  }
  grpc::Status Wait(grpc::ServerContext*, const pb::WaitRequest* request,
                    pb::WaitResponse* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    waits.push_back(*request);
    changed_.wait_for(lock, std::chrono::milliseconds(request->timeout_ms()),
                      [&] { return wait_set_; });
    *response = wait_;
    if (!wait_set_) response->set_phase(pb::PHASE_EXECUTING);
    return grpc::Status::OK;
  }
  grpc::Status Goodbye(grpc::ServerContext*, const pb::GoodbyeRequest* request,
                       pb::GoodbyeResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    goodbyes.push_back(request->session_id());
    return grpc::Status::OK;
  }

  void SetWait(pb::WaitResponse response) {
    std::lock_guard<std::mutex> lock(mu_);
    wait_ = std::move(response);
    wait_set_ = true;
    changed_.notify_all();
  }
  void SetPending(pb::PollResponse response) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(response);
  }
  std::mutex& mu() { return mu_; }

  // Guarded by mu().
  std::vector<pb::TrainerHello> hellos;
  std::vector<pb::RegisterTensorsRequest> registrations;
  std::vector<pb::TransferRequest> saves, loads;
  std::vector<pb::WaitRequest> waits;
  std::vector<std::string> goodbyes;

 private:
  grpc::Status Transfer(const pb::TransferRequest& request, pb::TransferResponse* response,
                        std::vector<pb::TransferRequest>* log) {
    std::lock_guard<std::mutex> lock(mu_);
    log->push_back(request);
    response->set_operation_id(request.operation_id().empty() ? "op-1" : request.operation_id());
    return grpc::Status::OK;
  }

  std::mutex mu_;
  std::condition_variable changed_;
  pb::WaitResponse wait_;
  bool wait_set_ = false;
  pb::PollResponse pending_;
};

pb::WaitResponse Phase(pb::OperationPhase phase, absl::StatusCode code = absl::StatusCode::kOk,
                       const std::string& message = "") {
  pb::WaitResponse r;
  r.set_phase(phase);
  r.set_code(static_cast<int>(code));
  r.set_message(message);
  return r;
}

EnvLookup NoEnv() {
  return [](const std::string&) { return std::optional<std::string>(); };
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unix socket paths must stay short (108 bytes), so the socket lives under /tmp.
    path_ = absl::StrCat("/tmp/ckpt-client-test-", getpid(), "-", counter_++, ".sock");
    unlink(path_.c_str());
    address_ = absl::StrCat("unix:", path_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address_, grpc::InsecureServerCredentials());
    builder.RegisterService(&worker_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    unlink(path_.c_str());
  }

  Options ExplicitOptions() const {
    Options o;
    o.job = "job7";
    o.rank = 1;
    o.world_size = 2;
    o.local_rank = 1;
    o.worker_address = address_;
    o.rpc_timeout = absl::Seconds(10);
    return o;
  }
  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(ExplicitOptions(), NoEnv());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static inline int counter_ = 0;
  std::string path_, address_;
  FakeWorker worker_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientTest, ConnectSaysHelloWithItsIdentityAndGoodbyeWhenDestroyed) {
  {
    std::unique_ptr<Client> client = Connect();
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->session_id(), "session-1");
    EXPECT_EQ(client->worker_id(), "w-test-0");
    EXPECT_EQ(client->worker_host(), "fakehost");
    std::lock_guard<std::mutex> lock(worker_.mu());
    ASSERT_EQ(worker_.hellos.size(), 1u);
    EXPECT_EQ(worker_.hellos[0].job(), "job7");
    EXPECT_EQ(worker_.hellos[0].rank(), 1);
    EXPECT_EQ(worker_.hellos[0].world_size(), 2);
    EXPECT_EQ(worker_.hellos[0].local_rank(), 1);
    EXPECT_EQ(worker_.hellos[0].pid(), getpid());
  }
  std::lock_guard<std::mutex> lock(worker_.mu());
  EXPECT_EQ(worker_.goodbyes, std::vector<std::string>{"session-1"});
}

TEST_F(ClientTest, ConnectToNoWorkerNamesTheJobRankAndAddressWithinItsTimeout) {
  Options o = ExplicitOptions();
  o.worker_address = absl::StrCat(address_, ".absent");
  o.rpc_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto client = Client::Connect(o, NoEnv());
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::StrContains(client.status().message(), "job job7 rank 1: cannot connect"))
      << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), *o.worker_address)) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(ClientTest, SaveSendsAnAbsolutePathAndReturnsOnceSnapshottedThenWaitsForTheCommit) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  pb::WaitResponse snapshotted = Phase(pb::PHASE_COMMITTING);
  snapshotted.set_snapshotted(true);
  worker_.SetWait(snapshotted);
  SaveOptions options;
  options.metadata = {{"step", "100"}};
  auto handle = client->Save("relative/step100", *state, options);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ((*handle)->operation_id(), "op-1");
  {
    std::lock_guard<std::mutex> lock(worker_.mu());
    ASSERT_EQ(worker_.saves.size(), 1u);
    EXPECT_EQ(worker_.saves[0].path(),
              (std::filesystem::current_path() / "relative/step100").string());
    EXPECT_EQ(worker_.saves[0].metadata().at("step"), "100");
    EXPECT_EQ(worker_.saves[0].session_id(), "session-1");
    ASSERT_FALSE(worker_.waits.empty());
    EXPECT_TRUE(worker_.waits.back().until_snapshot());
    EXPECT_EQ(worker_.registrations.size(), 1u);  // the state dict is shared first
  }
  // Not durable until the worker reports the operation done.
  EXPECT_EQ((*handle)->WaitDurable(absl::Milliseconds(200)).code(),
            absl::StatusCode::kDeadlineExceeded);
  worker_.SetWait(Phase(pb::PHASE_DONE));
  EXPECT_TRUE((*handle)->WaitDurable(absl::Seconds(30)).ok());
}

TEST_F(ClientTest, SaveAndLoadSendAnObjectStoreUrlAndPersistToAsTheyAre) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  worker_.SetWait(Phase(pb::PHASE_DONE));
  auto saved = client->Save("s3://bucket/ckpts/step100", *state, SaveOptions());
  ASSERT_TRUE(saved.ok()) << saved.status();
  SaveOptions persisted;
  persisted.persist_to = "s3://bucket/ckpts/step200";
  ASSERT_TRUE(client->Save("mem://step200", *state, persisted).ok());
  EXPECT_TRUE(client->Load("s3://bucket/ckpts/step100", *state, LoadOptions()).ok());
  std::lock_guard<std::mutex> lock(worker_.mu());
  ASSERT_EQ(worker_.saves.size(), 2u);
  EXPECT_EQ(worker_.saves[0].path(), "s3://bucket/ckpts/step100");
  EXPECT_EQ(worker_.saves[1].path(), "mem://step200");
  EXPECT_EQ(worker_.saves[1].persist_to(), "s3://bucket/ckpts/step200");
  ASSERT_EQ(worker_.loads.size(), 1u);
  EXPECT_EQ(worker_.loads[0].path(), "s3://bucket/ckpts/step100");
}

TEST_F(ClientTest, SaveAbortedBeforeTheSnapshotReturnsTheCoordinatorsDiagnosis) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  worker_.SetWait(Phase(pb::PHASE_ABORTED, absl::StatusCode::kUnavailable,
                        "worker w-9 (pid 42) on host h missed its lease"));
  auto handle = client->Save("/ckpt/a", *client->NewStateDict());
  ASSERT_EQ(handle.status().code(), absl::StatusCode::kUnavailable) << handle.status();
  EXPECT_TRUE(absl::StrContains(handle.status().message(), "missed its lease"));
}

TEST_F(ClientTest, LoadRefusesAnUnknownAlgorithmWithoutAskingTheWorker) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  LoadOptions options;
  options.exchange_algorithm = "teleport";
  absl::Status s = client->Load("/ckpt/a", *state, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "LoadOptions::exchange_algorithm")) << s;
  std::lock_guard<std::mutex> lock(worker_.mu());
  EXPECT_TRUE(worker_.loads.empty());
}

TEST_F(ClientTest, LoadSendsItsAlgorithmAndBudgetAndReturnsTheAbortDiagnosis) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  worker_.SetWait(Phase(pb::PHASE_ABORTED, absl::StatusCode::kInvalidArgument,
                        "tensor \"w\" is not in the checkpoint"));
  LoadOptions options;
  options.exchange_algorithm = "broadcast";
  options.memory_budget_bytes = 12345;
  absl::Status s = client->Load("/ckpt/a", *state, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "tensor \"w\"")) << s;
  std::lock_guard<std::mutex> lock(worker_.mu());
  ASSERT_EQ(worker_.loads.size(), 1u);
  EXPECT_EQ(worker_.loads[0].load_algorithm(), pb::LOAD_BROADCAST);
  EXPECT_EQ(worker_.loads[0].memory_budget_bytes(), 12345);
  EXPECT_FALSE(worker_.waits.back().until_snapshot());
}

TEST_F(ClientTest, PublishAndReceiveRefuseNegativeVersionsAndOnePastTheLargest) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  PublishOptions negative;
  negative.version = -7;
  auto refused = client->Publish("policy", *state, negative);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "version -7 of xfer://policy"))
      << refused.status();
  ReceiveOptions receive;
  receive.version = -7;
  absl::StatusOr<ReceivedVersion> received = client->Receive("policy", *state, receive);
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument) << received.status();
  EXPECT_TRUE(absl::StrContains(received.status().message(), "version -7 of xfer://policy"))
      << received.status();
  // The largest version publishes; the one after it cannot be numbered.
  pb::WaitResponse snapshotted = Phase(pb::PHASE_COMMITTING);
  snapshotted.set_snapshotted(true);
  worker_.SetWait(snapshotted);
  PublishOptions largest;
  largest.version = INT64_MAX;
  auto published = client->Publish("policy", *state, largest);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ((*published)->version(), INT64_MAX);
  auto next = client->Publish("policy", *state, PublishOptions());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument) << next.status();
  EXPECT_TRUE(absl::StrContains(next.status().message(), "xfer://policy")) << next.status();
  EXPECT_TRUE(absl::StrContains(next.status().message(), "9223372036854775807")) << next.status();
  std::lock_guard<std::mutex> lock(worker_.mu());
  ASSERT_EQ(worker_.saves.size(), 1u);  // only the valid one reached the worker
  EXPECT_EQ(worker_.saves[0].path(), "xfer://policy@9223372036854775807");
  EXPECT_TRUE(worker_.loads.empty());
}

TEST_F(ClientTest, PollWithNothingPendingTransfersNothing) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  auto polled = client->Poll(*state);
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_FALSE(polled->performed);
  std::lock_guard<std::mutex> lock(worker_.mu());
  EXPECT_TRUE(worker_.saves.empty());
  EXPECT_TRUE(worker_.loads.empty());
}

TEST_F(ClientTest, PollPerformsAPendingLoadUnderItsOperationIdAfterPreparing) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  pb::PollResponse pending;
  pending.set_pending(true);
  pending.set_operation_id("op-7");
  pending.set_kind(pb::OPERATION_LOAD);
  pending.set_path("/ckpt/b");
  worker_.SetPending(pending);
  worker_.SetWait(Phase(pb::PHASE_DONE));
  std::vector<std::string> prepared;
  auto polled = client->Poll(*state, [&](const std::string& kind, const std::string& path) {
    prepared.push_back(kind + " " + path);
    return absl::OkStatus();
  });
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_TRUE(polled->performed);
  EXPECT_EQ(polled->kind, "load");
  EXPECT_EQ(polled->operation_id, "op-7");
  EXPECT_EQ(prepared, std::vector<std::string>{"load /ckpt/b"});
  std::lock_guard<std::mutex> lock(worker_.mu());
  ASSERT_EQ(worker_.loads.size(), 1u);
  EXPECT_EQ(worker_.loads[0].operation_id(), "op-7");
  EXPECT_EQ(worker_.loads[0].path(), "/ckpt/b");
}

TEST_F(ClientTest, PollReturnsThePrepareErrorWithoutTransferring) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<StateDict> state = client->NewStateDict();
  pb::PollResponse pending;
  pending.set_pending(true);
  pending.set_operation_id("op-8");
  pending.set_kind(pb::OPERATION_SAVE);
  pending.set_path("/ckpt/c");
  worker_.SetPending(pending);
  auto polled = client->Poll(*state, [](const std::string&, const std::string&) {
    return absl::FailedPreconditionError("staging copy failed");
  });
  EXPECT_EQ(polled.status().code(), absl::StatusCode::kFailedPrecondition) << polled.status();
  std::lock_guard<std::mutex> lock(worker_.mu());
  EXPECT_TRUE(worker_.saves.empty());
}

TEST_F(ClientTest, ShareRefusesAStateDictOfAnotherRank) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  StateDict other("job7", 0);
  absl::Status s = client->Share(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "state dict of rank 0 shared by rank 1")) << s;
}

}  // namespace
}  // namespace ckpt::client
