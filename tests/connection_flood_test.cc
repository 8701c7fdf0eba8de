// Issue 39, finding 3: a local client that opens more idle TCP connections than the
// coordinator's open-files limit, then lets go, left the coordinator deaf for good (gRPC 1.51's
// listener stops accepting after EMFILE). These tests flood a real coordinator from one loopback
// address (127.0.0.3) and check, from another (127.0.0.1), that `ckptctl status` answers during
// the flood and after it, that the flooding peer keeps no more than its budget, that a new
// worker can register afterwards, and that connections which never handshake are shed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

// Idle TCP connections to the coordinator from one source address, closed on destruction.
class Flood {
 public:
  explicit Flood(std::string source) : source_(std::move(source)) {}
  ~Flood() { Release(); }

  // Opens `n` connections to `address` (host:port) and waits until each is connected (the
  // kernel completes the handshake whether or not the server has accepted yet).
  void Open(const std::string& address, int n) {
    const size_t colon = address.rfind(':');
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port)) << address;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr), 1) << address;
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ASSERT_EQ(inet_pton(AF_INET, source_.c_str(), &from.sin_addr), 1);
    for (int i = 0; i < n; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      ASSERT_GE(fd, 0) << "socket " << i << ": " << strerror(errno);
      fds_.push_back(fd);
      ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0) << strerror(errno);
      if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
        ASSERT_EQ(errno, EINPROGRESS) << "connection " << i << ": " << strerror(errno);
        pollfd p{fd, POLLOUT, 0};
        ASSERT_EQ(poll(&p, 1, 30000), 1) << "connection " << i << " did not complete in 30 s";
      }
    }
  }

  // How many connections the server has not closed (no end of stream, no reset). Reads and
  // drops what the server sent (its HTTP/2 settings) to see the end behind it.
  int StillOpen() {
    int open = 0;
    closed_.resize(fds_.size(), false);
    for (size_t i = 0; i < fds_.size(); ++i) {
      char buffer[4096];
      ssize_t got = 0;
      while (!closed_[i] && (got = recv(fds_[i], buffer, sizeof(buffer), MSG_DONTWAIT)) > 0) {
      }
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        ++open;
      } else {
        closed_[i] = true;
      }
    }
    return open;
  }

  void Release() {
    for (int fd : fds_) close(fd);
    fds_.clear();
    closed_.clear();
  }

 private:
  std::string source_;
  std::vector<int> fds_;
  std::vector<bool> closed_;  // seen closed by the server
};

// Whether `ckptctl status` answers (exit 0) before its own 5 s deadline; the output in *out.
bool StatusAnswers(Cluster& cluster, std::string* out) {
  std::vector<std::string> args = {"status", "--coordinator", cluster.address()};
  for (const std::string& flag : cluster.OperatorFlags()) args.push_back(flag);
  return cluster.RunCkptctl(args, out) == 0;
}

// Retries `ckptctl status` until it answers or 60 s pass (a hang guard; on a coordinator that
// stopped accepting it never answers).
bool StatusAnswersSoon(Cluster& cluster, std::string* out) {
  return WaitFor([&] { return StatusAnswers(cluster, out); });
}

class ConnectionFloodTest : public ::testing::TestWithParam<bool> {};

TEST_P(ConnectionFloodTest, OnePeersFloodLeavesAnotherPeersStatusAnsweringDuringAndAfter) {
  Cluster cluster;
  if (GetParam()) cluster.UseTls();
  // 256 descriptors: the flood of 400 would run the process out of them without a budget.
  cluster.StartCoordinator(
      {"--max_open_files=256", "--max_connections_per_peer=64", "--handshake_timeout_ms=600000"});
  cluster.StartWorker(0);  // connected before the flood
  Flood flood("127.0.0.3");
  flood.Open(cluster.address(), 400);
  if (HasFatalFailure()) return;
  // The coordinator keeps 64 of the flood's connections and refuses the rest at once.
  int open = -1;
  EXPECT_TRUE(WaitFor([&] { return (open = flood.StillOpen()) <= 64; }))
      << open << " of the flood's 400 connections still open\n"
      << ClusterLogs(cluster);
  std::string out;
  EXPECT_TRUE(StatusAnswersSoon(cluster, &out)) << "during the flood: " << out << "\n"
                                                << ClusterLogs(cluster);
  EXPECT_EQ(flood.StillOpen(), 64) << "the flooding peer's budgeted connections were dropped";
  EXPECT_NE(out.find(cluster.worker_id(0)), std::string::npos) << out;

  flood.Release();
  EXPECT_TRUE(StatusAnswersSoon(cluster, &out)) << "after the flood: " << out << "\n"
                                                << ClusterLogs(cluster);
  const int second = cluster.StartWorker(1);  // waits until it registered
  pb::GetStatusResponse status = cluster.Status();
  EXPECT_EQ(LiveWorkers(status), 2) << ClusterLogs(cluster);
  EXPECT_NE(FindWorker(status, cluster.worker_id(second)), nullptr);
}

INSTANTIATE_TEST_SUITE_P(PlainAndTls, ConnectionFloodTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plaintext";
                         });

TEST(ConnectionFloodTest, AcceptingRecoversAfterTheProcessRanOutOfDescriptors) {
  Cluster cluster;
  // A budget far above the open-files limit: accept4 itself fails with EMFILE.
  cluster.StartCoordinator({"--max_open_files=128", "--max_connections=100000",
                            "--max_connections_per_peer=100000", "--handshake_timeout_ms=600000"});
  Flood flood("127.0.0.3");
  flood.Open(cluster.address(), 300);
  if (HasFatalFailure()) return;
  int open = -1;
  EXPECT_TRUE(WaitFor([&] { return (open = flood.StillOpen()) < 128; }))
      << open << " of the flood's 300 connections still open\n"
      << ClusterLogs(cluster);
  std::string out;
  // Another peer takes the place of one of the flood's connections.
  EXPECT_TRUE(StatusAnswersSoon(cluster, &out)) << "while out of descriptors: " << out << "\n"
                                                << ClusterLogs(cluster);
  flood.Release();
  EXPECT_TRUE(StatusAnswersSoon(cluster, &out)) << "after the flood: " << out << "\n"
                                                << ClusterLogs(cluster);
  cluster.StartWorker(0);
  EXPECT_EQ(LiveWorkers(cluster.Status()), 1) << ClusterLogs(cluster);
}

TEST(ConnectionFloodTest, ConnectionsThatNeverHandshakeAreShed) {
  Cluster cluster;
  cluster.StartCoordinator({"--handshake_timeout_ms=1000"});
  Flood flood("127.0.0.3");
  flood.Open(cluster.address(), 32);
  if (HasFatalFailure()) return;
  int open = -1;
  EXPECT_TRUE(WaitFor([&] { return (open = flood.StillOpen()) == 0; }))
      << open << " idle connections still open\n"
      << ClusterLogs(cluster);
  std::string out;
  EXPECT_TRUE(StatusAnswers(cluster, &out)) << out;
}

}  // namespace
}  // namespace ckpt::testing
