#include "rendezvous/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_auth.h"
#include "gtest/gtest.h"
#include "rendezvous/kv_store.h"
#include "rendezvous/loopback_rendezvous.h"
#include "rendezvous/rendezvous_service.h"

namespace ckpt {
namespace {

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(rendezvous_.ok()); }

  LoopbackRendezvous rendezvous_;
};

TEST_F(GrpcStoreTest, SetGetAddRoundTripBinaryValues) {
  GrpcStore store(rendezvous_.address());
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(store.Set("k", binary, deadline).ok());
  auto got = store.Get({"k"}, deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], binary);
  auto v = store.Add("counter", 5, deadline);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 5);
  v = store.Add("counter", -2, deadline);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
}

// The reader's Get reaches the server (its authorizer sees the call, which is authorized before
// it waits) before the writer sets the key.
TEST(GrpcStoreWaitTest, GetWaitsForAKeySetByAnotherClient) {
  KvStore kv;
  absl::Mutex mu;
  int authorized = 0;
  RendezvousService service(&kv,
                            [&](const Peer&, absl::string_view) -> absl::StatusOr<std::string> {
                              absl::MutexLock lock(&mu);
                              ++authorized;
                              return std::string("job");
                            });
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  GrpcStore reader(address);
  GrpcStore writer(address);
  std::thread t([&] {
    {
      absl::MutexLock lock(&mu);
      auto reader_arrived = [&authorized]() { return authorized >= 1; };
      ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&reader_arrived), absl::Seconds(10)));
    }
    ASSERT_TRUE(writer.Set("load/op-1/late", "x", absl::Now() + absl::Seconds(5)).ok());
  });
  auto got = reader.Get({"load/op-1/late"}, absl::Now() + absl::Seconds(10));
  t.join();
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], "x");
}

TEST_F(GrpcStoreTest, TimeoutIsDeadlineExceededNamingMissingKeys) {
  GrpcStore store(rendezvous_.address());
  ASSERT_TRUE(store.Set("here", "1", absl::Now() + absl::Seconds(5)).ok());
  auto got = store.Get({"here", "rank/7"}, absl::Now() + absl::Milliseconds(200));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("rank/7"), std::string::npos) << got.status();
}

TEST_F(GrpcStoreTest, AddOnTextValueIsInvalidArgument) {
  GrpcStore store(rendezvous_.address());
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  ASSERT_TRUE(store.Set("t", "text", deadline).ok());
  EXPECT_EQ(store.Add("t", 1, deadline).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrpcStoreNoServerTest, UnreachableServerFailsByTheDeadline) {
  GrpcStore store("127.0.0.1:1");
  absl::Time start = absl::Now();
  absl::Status s = store.Set("k", "v", start + absl::Milliseconds(300));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos) << s;
}

}  // namespace
}  // namespace ckpt
