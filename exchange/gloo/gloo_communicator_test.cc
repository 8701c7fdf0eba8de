#include "exchange/gloo/gloo_communicator.h"

#include <signal.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "exchange/communicator_conformance.h"
#include "exchange/exchange_testing.h"
#include "exchange/thread_group.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Deterministic bytes for (rank, tag, index).
char Byte(int rank, int tag, size_t i) {
  return static_cast<char>((rank * 131 + tag * 31 + i * 7 + (i >> 8)) & 0xff);
}

std::string Payload(int rank, int tag, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = Byte(rank, tag, i);
  return s;
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
}

#define RETURN_IF_MISMATCH(cond, msg) \
  if (!(cond)) return absl::InternalError(msg)

// Every Communicator operation, its zero-size and uneven cases, argument errors and the
// deadline/abort promises (exchange/communicator_conformance.h), at 1 to 4 ranks.
INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(GlooBackend(), {1, 2, 3, 4})),
                         ConformanceCaseName);

// Bytes that rank `from` sends to rank `to` (some pairs send nothing).
size_t PairSize(int from, int to) {
  int v = (from * 7 + to * 13) % 6;
  return v == 0 ? 0 : static_cast<size_t>(v * 333 + from);
}

// Uses the Communicator base class's packing AllToAllVBuffers instead of Gloo's in-place one.
class PackingFallbackCommunicator : public FaultInjectingCommunicator {
 public:
  using FaultInjectingCommunicator::FaultInjectingCommunicator;
  absl::Status AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                absl::Span<const RecvBuffer> recvs, absl::Time deadline) override {
    return Communicator::AllToAllVBuffers(sends, recvs, deadline);
  }
};

// The base class's packing fallback (used by backends without an in-place AllToAllVBuffers) over
// Gloo delivers the same bytes as Gloo's own in-place version (the conformance suite covers that).
TEST(GlooAllToAllVBuffersTest, BaseClassPackingFallbackDeliversEveryPairsBuffer) {
  for (int n : {1, 3}) {
    CommunicatorMaker gloo = GlooMaker(absl::StrCat("a2ab_fallback_", n));
    CommunicatorMaker maker =
        [&](Store* store, int rank, int size,
            absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      auto comm = gloo(store, rank, size, deadline);
      if (!comm.ok()) return comm;
      return std::unique_ptr<Communicator>(
          new PackingFallbackCommunicator(std::move(*comm), -1, nullptr));
    };
    ExpectAllOk(RunOnThreads(
        n, maker, absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
          std::vector<std::string> send(comm.size()), recv(comm.size()), expected(comm.size());
          std::vector<SendBuffer> sends(comm.size());
          std::vector<RecvBuffer> recvs(comm.size());
          for (int p = 0; p < comm.size(); ++p) {
            send[p] = Payload(rank * 100 + p, 6, PairSize(rank, p));
            expected[p] = Payload(p * 100 + rank, 6, PairSize(p, rank));
            recv[p] = std::string(expected[p].size(), '?');
            sends[p] = {send[p].data(), send[p].size()};
            recvs[p] = {recv[p].data(), recv[p].size()};
          }
          absl::Status s = comm.AllToAllVBuffers(sends, recvs, Deadline());
          if (!s.ok()) return s;
          RETURN_IF_MISMATCH(recv == expected, "all_to_all_v_buffers (fallback) differs");
          return absl::OkStatus();
        }));
  }
}

TEST(GlooFaultTest, RankThatNeverArrivesIsNamedWithinTheDeadline) {
  InMemoryStore store;
  absl::Time start = absl::Now();
  GlooOptions options;
  options.group_name = "never";
  // Ranks 0 and 1 of 3 arrive; rank 2 never does.
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] =
          CreateGlooCommunicator(&store, r, 3, options, start + absl::Seconds(2)).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("ranks [2] never arrived"), std::string::npos) << s;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A rank that leaves in the middle of a large message: the sender's writes fail naming it
// instead of SIGPIPE killing this process.
TEST(GlooFaultTest, LargeSendToAPeerThatLeftFailsTheCallInsteadOfKillingTheProcess) {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &default_action, nullptr), 0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    auto statuses = RunOnThreads(2, GlooMaker(absl::StrCat("left_", attempt)), absl::Seconds(20),
                                 [&](int rank, Communicator& comm) -> absl::Status {
                                   std::string payload(64 << 20, 'p');
                                   if (rank == 1) {
                                     // Gives up part-way through the first message and leaves: its
                                     // sockets close with unread bytes, so rank 0's writes meet a
                                     // reset connection.
                                     comm.Recv(payload.data(), payload.size(), 0, 0,
                                               absl::Now() + absl::Milliseconds(5))
                                         .IgnoreError();
                                     return absl::OkStatus();
                                   }
                                   absl::Status s;
                                   for (int i = 0; i < 8 && s.ok(); ++i) {
                                     s = comm.Send(payload.data(), payload.size(), 1, i,
                                                   absl::Now() + absl::Milliseconds(300));
                                   }
                                   return s;
                                 });
    EXPECT_TRUE(statuses[1].ok()) << statuses[1];
    EXPECT_TRUE(statuses[0].code() == absl::StatusCode::kUnavailable ||
                statuses[0].code() == absl::StatusCode::kDeadlineExceeded)
        << statuses[0];
    EXPECT_NE(statuses[0].message().find("rank 1"), std::string::npos) << statuses[0];
  }
}

TEST(GlooSignalTest, CreationIgnoresSigpipeUnlessTheProgramHandlesIt) {
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_handler = SIG_DFL;
  ASSERT_EQ(sigaction(SIGPIPE, &action, nullptr), 0);
  InMemoryStore store;
  GlooOptions options;
  options.group_name = "sigpipe_default";
  ASSERT_TRUE(CreateGlooCommunicator(&store, 0, 1, options, Deadline()).ok());
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);

  static void (*const kProgramHandler)(int) = [](int) {};
  action.sa_handler = kProgramHandler;
  ASSERT_EQ(sigaction(SIGPIPE, &action, nullptr), 0);
  options.group_name = "sigpipe_handled";
  ASSERT_TRUE(CreateGlooCommunicator(&store, 0, 1, options, Deadline()).ok());
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, kProgramHandler);

  action.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &action, nullptr);
}

TEST(GlooArgumentTest, AllToAllVBuffersArgumentErrorsSayWhatIsWrong) {
  auto statuses = RunOnThreads(
      2, GlooMaker("args"), absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
        char b = 0;
        absl::Status s;
        // One buffer per peer is required, and a rank's message to itself must fit.
        std::vector<SendBuffer> sends(3);
        std::vector<RecvBuffer> recvs(2);
        s = comm.AllToAllVBuffers(sends, recvs, Deadline());
        RETURN_IF_MISMATCH(s.code() == absl::StatusCode::kInvalidArgument &&
                               s.message().find("3 sends and 2 receives") != std::string::npos,
                           s.ToString());
        char c = 0;
        sends.resize(2);
        sends[rank] = {&b, 1};
        recvs[rank] = {&c, 0};
        s = comm.AllToAllVBuffers(sends, recvs, Deadline());
        RETURN_IF_MISMATCH(s.code() == absl::StatusCode::kInvalidArgument &&
                               s.message().find(absl::StrCat(
                                   "rank ", rank, " sends itself 1 bytes")) != std::string::npos,
                           s.ToString());
        // Argument errors do not break the communicator.
        return comm.Barrier(Deadline());
      });
  ExpectAllOk(statuses);
}

// Nice value of every thread of this process, by thread id (field 19 of /proc/self/task/T/stat).
std::map<std::string, int> ThreadNiceValues() {
  std::map<std::string, int> nice;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    // Fields after the command name start at field 3 (state); nice is field 19.
    for (int i = 3; i <= 19 && fields >> field; ++i) {
    }
    nice[entry.path().filename().string()] = std::stoi(field);
  }
  return nice;
}

// The threads a communicator starts (Gloo's event loop) and their nice values.
std::vector<int> NiceOfThreadsStartedBy(const GlooOptions& options) {
  InMemoryStore store;
  std::map<std::string, int> before = ThreadNiceValues();
  auto comm = CreateGlooCommunicator(&store, 0, 1, options, Deadline());
  EXPECT_TRUE(comm.ok()) << comm.status();
  std::vector<int> started;
  for (const auto& [tid, nice] : ThreadNiceValues()) {
    if (!before.count(tid)) started.push_back(nice);
  }
  return started;
}

TEST(GlooPriorityTest, EventLoopThreadRunsNicerWhileTheCallerKeepsItsPriority) {
  const int caller = getpriority(PRIO_PROCESS, 0);
  GlooOptions options;
  options.group_name = "nice";
  options.loop_thread_nice = 7;
  std::vector<int> started = NiceOfThreadsStartedBy(options);
  ASSERT_FALSE(started.empty());
  for (int nice : started) EXPECT_EQ(nice, std::min(19, caller + 7));
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), caller);

  options.group_name = "not_nice";
  options.loop_thread_nice = 0;
  started = NiceOfThreadsStartedBy(options);
  ASSERT_FALSE(started.empty());
  for (int nice : started) EXPECT_EQ(nice, caller);
}

}  // namespace
}  // namespace ckpt
