// FetchCoordinatorStatus against a real in-process coordinator: the coordinator answers in
// pages (at most 1000 entries each, issue 39), and ckptctl status / transfer list get every
// worker and every rank of a job split across pages, joined again.
#include "tools/ckptctl/coordinator_channel.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator_service.h"
#include "gtest/gtest.h"

namespace ckpt::ckptctl {
namespace {

TEST(CoordinatorChannelTest, FetchCoordinatorStatusJoinsEveryPage) {
  coordinator::RealClock clock;
  coordinator::CoordinatorOptions options;
  options.lease = absl::Seconds(60);
  coordinator::CoordinatorService service(&clock, options);
  service.Start();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = pb::Coordinator::NewStub(channel);
  constexpr int kWorkers = 700;  // with the job's 700 ranks: two pages of 1000 entries
  std::vector<std::string> ids;
  for (int i = 0; i < kWorkers; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    pb::RegisterWorkerRequest request;
    request.mutable_info()->set_host(absl::StrCat("node", i));
    request.mutable_info()->set_pid(i + 1);
    pb::RegisterWorkerResponse response;
    ASSERT_TRUE(stub->RegisterWorker(&context, request, &response).ok());
    ids.push_back(response.worker_id());
  }
  for (int r = 0; r < kWorkers; ++r) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    pb::AttachRankRequest request;
    request.set_job("big");
    request.set_world_size(kWorkers);
    request.set_rank(r);
    request.set_worker_id(ids[r]);
    pb::AttachRankResponse response;
    ASSERT_TRUE(stub->AttachRank(&context, request, &response).ok());
  }
  {
    grpc::ClientContext context;
    pb::GetStatusResponse first;
    ASSERT_TRUE(stub->GetStatus(&context, pb::GetStatusRequest(), &first).ok());
    ASSERT_FALSE(first.next_page_token().empty()) << "the listing must span pages";
  }
  absl::StatusOr<pb::GetStatusResponse> all =
      FetchCoordinatorStatus(channel, address, "", absl::Seconds(30));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->workers_size(), kWorkers);
  std::set<std::string> listed;
  for (const pb::WorkerStatus& w : all->workers()) listed.insert(w.worker_id());
  EXPECT_EQ(listed.size(), static_cast<size_t>(kWorkers));
  ASSERT_EQ(all->jobs_size(), 1);  // continued on the next page, joined again
  ASSERT_EQ(all->jobs(0).ranks_size(), kWorkers);
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(all->jobs(0).ranks(r).rank(), r);
  EXPECT_EQ(all->incarnation(), service.incarnation());
  EXPECT_TRUE(all->next_page_token().empty());
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace ckpt::ckptctl
