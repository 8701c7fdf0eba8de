#include "worker/trainer_socket.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

// Answers Status with the caller's credentials as the trainer socket reports them.
class EchoCredentials final : public pb::Worker::Service {
 public:
  explicit EchoCredentials(const TrainerSocket* socket) : socket_(socket) {}
  grpc::Status Status(grpc::ServerContext* context, const pb::WorkerStatusRequest*,
                      pb::WorkerStatusResponse* response) override {
    absl::StatusOr<TrainerCredentials> cred = socket_->CallerOf(*context);
    if (!cred.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, cred.status().ToString());
    response->set_worker_id(absl::StrCat("uid ", cred->uid));
    response->add_sessions()->set_pid(cred->pid);
    return grpc::Status::OK;
  }
  grpc::Status RegisterTensors(grpc::ServerContext*, const pb::RegisterTensorsRequest* request,
                               pb::RegisterTensorsResponse* response) override {
    response->set_host_bytes(request->session_id().size());
    return grpc::Status::OK;
  }

 private:
  const TrainerSocket* socket_;
};

class TrainerSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat("/tmp/ckpt-ts-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->line(), ".sock");
    unlink(path_.c_str());
  }
  void TearDown() override { unlink(path_.c_str()); }

  std::string path_;
};

TEST_F(TrainerSocketTest, CallsCarryTheCallersPidAndUidFromTheKernel) {
  auto socket = TrainerSocket::Open({path_, {}});
  ASSERT_TRUE(socket.ok()) << socket.status();
  EchoCredentials service(socket->get());
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*socket)->Serve(server.get());

  auto stub =
      pb::Worker::NewStub(grpc::CreateChannel("unix:" + path_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  pb::WorkerStatusResponse response;
  grpc::Status s = stub->Status(&context, pb::WorkerStatusRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.worker_id(), absl::StrCat("uid ", getuid()));
  ASSERT_EQ(response.sessions_size(), 1);
  EXPECT_EQ(response.sessions(0).pid(), getpid());
  (*socket)->Stop();
  EXPECT_NE(access(path_.c_str(), F_OK), 0) << "Stop removes the socket file";
  server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(TrainerSocketTest, HandedOverConnectionsKeepTheServersMessageSizeLimit) {
  auto socket = TrainerSocket::Open({path_, {}});
  ASSERT_TRUE(socket.ok()) << socket.status();
  EchoCredentials service(socket->get());
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);  // the worker's is 1 GiB; gRPC's default 4 MiB
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*socket)->Serve(server.get());
  auto stub =
      pb::Worker::NewStub(grpc::CreateChannel("unix:" + path_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  pb::RegisterTensorsRequest big;
  big.set_session_id(std::string(16 << 20, 's'));
  pb::RegisterTensorsResponse response;
  grpc::Status s = stub->RegisterTensors(&context, big, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.host_bytes(), 16 << 20);
  (*socket)->Stop();
  server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(TrainerSocketTest, TheSocketIsPrivateWhateverTheUmask) {
  const mode_t previous = umask(0);
  auto socket = TrainerSocket::Open({path_, {}});
  umask(previous);
  ASSERT_TRUE(socket.ok()) << socket.status();
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(TrainerSocketTest, AllowingOtherUidsOpensTheModeForThem) {
  auto socket = TrainerSocket::Open({path_, {65534}});
  ASSERT_TRUE(socket.ok()) << socket.status();
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
}

TEST_F(TrainerSocketTest, NeverRemovesAFileThatIsNotASocket) {
  std::ofstream(path_) << "precious";
  auto socket = TrainerSocket::Open({path_, {}});
  EXPECT_EQ(socket.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(socket.status().message(), HasSubstr("not a socket"));
  EXPECT_THAT(socket.status().message(), HasSubstr(path_));
  std::ifstream in(path_);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), "precious");
}

TEST_F(TrainerSocketTest, RefusesASocketThatAnotherWorkerStillServes) {
  auto first = TrainerSocket::Open({path_, {}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = TrainerSocket::Open({path_, {}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another process serves"));
  struct stat st;
  EXPECT_EQ(lstat(path_.c_str(), &st), 0) << "the first worker's socket is still there";
}

TEST_F(TrainerSocketTest, ReplacesTheStaleSocketOfAWorkerThatDied) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path_.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  close(fd);  // bound, never listening, file left behind
  auto socket = TrainerSocket::Open({path_, {}});
  EXPECT_TRUE(socket.ok()) << socket.status();
}

}  // namespace
}  // namespace ckpt::worker
