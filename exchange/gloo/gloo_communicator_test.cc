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

// Bytes rank r contributes in the uneven tests: 0, odd and larger sizes mixed.
size_t UnevenSize(int r) { return (r * 1237 + 3) % 5 == 0 ? 0 : (r * 1237 + 3) % 4099 + 1; }

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
}

#define RETURN_IF_MISMATCH(cond, msg) \
  if (!(cond)) return absl::InternalError(msg)

class GlooCollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int N() const { return GetParam(); }
  std::string Group(absl::string_view what) const { return absl::StrCat(what, "_n", N()); }
};

TEST_P(GlooCollectivesTest, BroadcastFromEveryRootIncludingEmptyAndOddSizes) {
  ExpectAllOk(RunOnThreads(
      N(), GlooMaker(Group("bcast")), absl::Seconds(20),
      [&](int rank, Communicator& comm) -> absl::Status {
        // Sizes past 4 MiB take the pipelined chain on 3+ ranks (last chunk partial).
        for (size_t bytes :
             {size_t{0}, size_t{1}, size_t{7}, size_t{65537}, size_t{(5 << 20) + 3}}) {
          for (int root = 0; root < comm.size(); ++root) {
            std::string buf = rank == root ? Payload(root, bytes, bytes) : std::string(bytes, 'x');
            absl::Status s = comm.Broadcast(buf.data(), bytes, root, Deadline());
            if (!s.ok()) return s;
            RETURN_IF_MISMATCH(buf == Payload(root, bytes, bytes),
                               absl::StrCat("broadcast of ", bytes, " from ", root, " differs"));
          }
        }
        return absl::OkStatus();
      }));
}

TEST_P(GlooCollectivesTest, AllGatherVConcatenatesUnevenContributionsInRankOrder) {
  ExpectAllOk(RunOnThreads(N(), GlooMaker(Group("agv")), absl::Seconds(20),
                           [&](int rank, Communicator& comm) -> absl::Status {
                             std::vector<size_t> counts;
                             std::string expected;
                             for (int r = 0; r < comm.size(); ++r) {
                               counts.push_back(UnevenSize(r));
                               expected += Payload(r, 1, UnevenSize(r));
                             }
                             std::string mine = Payload(rank, 1, UnevenSize(rank));
                             std::string out(expected.size(), '?');
                             absl::Status s =
                                 comm.AllGatherV(mine.data(), counts, out.data(), Deadline());
                             if (!s.ok()) return s;
                             RETURN_IF_MISMATCH(out == expected, "all_gather_v result differs");
                             std::string eq = Payload(rank, 2, 5), eq_out(5 * comm.size(), '?'),
                                         eq_expected;
                             for (int r = 0; r < comm.size(); ++r) eq_expected += Payload(r, 2, 5);
                             s = comm.AllGather(eq.data(), 5, eq_out.data(), Deadline());
                             if (!s.ok()) return s;
                             RETURN_IF_MISMATCH(eq_out == eq_expected, "all_gather result differs");
                             return absl::OkStatus();
                           }));
}

TEST_P(GlooCollectivesTest, GatherVAndScatterVRoundTripThroughEveryRoot) {
  ExpectAllOk(RunOnThreads(N(), GlooMaker(Group("gsv")), absl::Seconds(20),
                           [&](int rank, Communicator& comm) -> absl::Status {
                             std::vector<size_t> counts;
                             std::string expected;
                             for (int r = 0; r < comm.size(); ++r) {
                               counts.push_back(UnevenSize(r + 1));
                               expected += Payload(r, 3, UnevenSize(r + 1));
                             }
                             for (int root = 0; root < comm.size(); ++root) {
                               std::string mine = Payload(rank, 3, UnevenSize(rank + 1));
                               std::string gathered(rank == root ? expected.size() : 0, '?');
                               absl::Status s = comm.GatherV(mine.data(), mine.size(), counts,
                                                             gathered.data(), root, Deadline());
                               if (!s.ok()) return s;
                               if (rank == root)
                                 RETURN_IF_MISMATCH(gathered == expected, "gather_v differs");
                               std::string back(mine.size(), '?');
                               s = comm.ScatterV(rank == root ? expected.data() : nullptr, counts,
                                                 back.data(), back.size(), root, Deadline());
                               if (!s.ok()) return s;
                               RETURN_IF_MISMATCH(
                                   back == mine, absl::StrCat("scatter_v from ", root, " differs"));
                             }
                             return absl::OkStatus();
                           }));
}

// Bytes that rank `from` sends to rank `to` in the all-to-all tests.
size_t PairSize(int from, int to) {
  int v = (from * 7 + to * 13) % 6;
  return v == 0 ? 0 : static_cast<size_t>(v * 333 + from);
}

TEST_P(GlooCollectivesTest, AllToAllVDeliversEveryPairsBytes) {
  ExpectAllOk(RunOnThreads(N(), GlooMaker(Group("a2av")), absl::Seconds(20),
                           [&](int rank, Communicator& comm) -> absl::Status {
                             std::vector<size_t> send_counts, recv_counts;
                             std::string send, expected;
                             for (int p = 0; p < comm.size(); ++p) {
                               send_counts.push_back(PairSize(rank, p));
                               send += Payload(rank * 100 + p, 4, PairSize(rank, p));
                               recv_counts.push_back(PairSize(p, rank));
                               expected += Payload(p * 100 + rank, 4, PairSize(p, rank));
                             }
                             std::string recv(expected.size(), '?');
                             absl::Status s = comm.AllToAllV(send.data(), send_counts, recv.data(),
                                                             recv_counts, Deadline());
                             if (!s.ok()) return s;
                             RETURN_IF_MISMATCH(recv == expected, "all_to_all_v differs");
                             return absl::OkStatus();
                           }));
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

TEST_P(GlooCollectivesTest, AllToAllVBuffersMovesSeparateBuffersInPlaceAndThroughTheFallback) {
  for (bool fallback : {false, true}) {
    CommunicatorMaker gloo = GlooMaker(Group(fallback ? "a2ab_fallback" : "a2ab"));
    CommunicatorMaker maker =
        [&](Store* store, int rank, int size,
            absl::Time deadline) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      auto comm = gloo(store, rank, size, deadline);
      if (!comm.ok() || !fallback) return comm;
      return std::unique_ptr<Communicator>(
          new PackingFallbackCommunicator(std::move(*comm), -1, nullptr));
    };
    ExpectAllOk(RunOnThreads(
        N(), maker, absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
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
          RETURN_IF_MISMATCH(recv == expected, absl::StrCat("all_to_all_v_buffers differs (",
                                                            fallback ? "fallback" : "gloo", ")"));
          return absl::OkStatus();
        }));
  }
}

TEST_P(GlooCollectivesTest, IndexedAllToAllVScattersSlicesWithDifferentBoundaries) {
  ExpectAllOk(RunOnThreads(
      N(), GlooMaker(Group("ia2a")), absl::Seconds(20),
      [&](int rank, Communicator& comm) -> absl::Status {
        const int n = comm.size();
        // Sender: rank's buffer is Payload(rank); for peer p it sends, in order, slices that
        // pick bytes [p*10, p*10+len) in three pieces (one possibly empty), backwards.
        std::string buffer = Payload(rank, 5, 1000);
        std::vector<std::vector<ByteSlice>> send_slices(n), recv_slices(n);
        auto pair_len = [](int from, int to) {
          return static_cast<size_t>((from + 2 * to) % 4 * 9);
        };
        for (int p = 0; p < n; ++p) {
          size_t len = pair_len(rank, p);
          size_t base = p * 10;
          size_t a = len / 3, b = len / 3 + (p % 2 ? 0 : 1) * 0, c = len - a - b;
          send_slices[p] = {{base + a + b, c}, {base + a, b}, {base, a}};
        }
        // Receiver: what p sends is [back third, middle, front third] of p's bytes; store them
        // into two slices of our output at 2000*p and 2000*p+500.
        size_t out_size = 2000 * n;
        std::string out(out_size, '.');
        std::string expected(out_size, '.');
        for (int p = 0; p < n; ++p) {
          size_t len = pair_len(p, rank);
          size_t half = len / 2;
          recv_slices[p] = {{2000 * static_cast<size_t>(p), half},
                            {2000 * static_cast<size_t>(p) + 500, len - half}};
          std::string peer_buf = Payload(p, 5, 1000);
          size_t base = rank * 10, a = len / 3, b = len / 3, c = len - a - b;
          std::string stream = peer_buf.substr(base + a + b, c) + peer_buf.substr(base + a, b) +
                               peer_buf.substr(base, a);
          expected.replace(2000 * p, half, stream.substr(0, half));
          expected.replace(2000 * p + 500, len - half, stream.substr(half));
        }
        absl::Status s =
            comm.IndexedAllToAllV(buffer.data(), send_slices, out.data(), recv_slices, Deadline());
        if (!s.ok()) return s;
        RETURN_IF_MISMATCH(out == expected, "indexed_all_to_all_v differs");
        return absl::OkStatus();
      }));
}

TEST_P(GlooCollectivesTest, SendRecvRingAndBarrier) {
  ExpectAllOk(
      RunOnThreads(N(), GlooMaker(Group("p2p")), absl::Seconds(20),
                   [&](int rank, Communicator& comm) -> absl::Status {
                     const int n = comm.size();
                     for (int round = 0; round < 3; ++round) {
                       absl::Status s = comm.Barrier(Deadline());
                       if (!s.ok()) return s;
                     }
                     if (n == 1) return absl::OkStatus();
                     int next = (rank + 1) % n, prev = (rank + n - 1) % n;
                     std::string out = Payload(rank, 6, 12345);
                     std::string in(12345, '?');
                     // Even ranks send first; odd ranks receive first (a blocking ring must not
                     // deadlock).
                     if (rank % 2 == 0) {
                       absl::Status s = comm.Send(out.data(), out.size(), next, 9, Deadline());
                       if (!s.ok()) return s;
                       s = comm.Recv(in.data(), in.size(), prev, 9, Deadline());
                       if (!s.ok()) return s;
                     } else {
                       absl::Status s = comm.Recv(in.data(), in.size(), prev, 9, Deadline());
                       if (!s.ok()) return s;
                       s = comm.Send(out.data(), out.size(), next, 9, Deadline());
                       if (!s.ok()) return s;
                     }
                     RETURN_IF_MISMATCH(in == Payload(prev, 6, 12345), "ring message differs");
                     return absl::OkStatus();
                   }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectivesTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

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

TEST(GlooFaultTest, StalledPeerTurnsIntoDeadlineExceededNamingItAndBreaksTheCommunicator) {
  absl::Time start = absl::Now();
  std::vector<absl::Status> second(2);
  auto statuses = RunOnThreads(
      2, GlooMaker("stall"), absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
        std::string buf(100, 'a');
        if (rank == 1) {
          // Rank 1 never joins the broadcast, then waits until rank 0 has given up.
          absl::SleepFor(absl::Seconds(2));
          return absl::OkStatus();
        }
        absl::Status s = comm.Broadcast(buf.data(), buf.size(), 1, absl::Now() + absl::Seconds(1));
        second[0] = comm.Barrier(absl::Now() + absl::Seconds(1));
        return s;
      });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded) << statuses[0];
  EXPECT_NE(statuses[0].message().find("from rank 1"), std::string::npos) << statuses[0];
  EXPECT_NE(statuses[0].message().find("gloo broadcast"), std::string::npos) << statuses[0];
  EXPECT_EQ(second[0].code(), absl::StatusCode::kFailedPrecondition) << second[0];
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(GlooFaultTest, PeerThatClosesMidExchangeIsUnavailableOrDeadlineNamingIt) {
  absl::Time start = absl::Now();
  auto statuses = RunOnThreads(
      3, GlooMaker("closes"), absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
        std::string buf(1 << 20, 'a');
        absl::Status s = comm.Broadcast(buf.data(), buf.size(), 0, absl::Now() + absl::Seconds(5));
        if (!s.ok()) return s;
        if (rank == 2) return absl::OkStatus();  // leaves; its communicator is destroyed
        std::vector<size_t> counts(3, 1000);
        std::string out(3000, '?');
        return comm.AllGatherV(buf.data(), counts, out.data(), absl::Now() + absl::Seconds(3));
      });
  EXPECT_TRUE(statuses[2].ok()) << statuses[2];
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(statuses[r].code() == absl::StatusCode::kUnavailable ||
                statuses[r].code() == absl::StatusCode::kDeadlineExceeded)
        << statuses[r];
    EXPECT_NE(statuses[r].message().find("rank 2"), std::string::npos) << statuses[r];
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
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

TEST(GlooArgumentTest, BadRootAndCountsAreInvalidArgument) {
  auto statuses = RunOnThreads(
      2, GlooMaker("args"), absl::Seconds(20), [&](int rank, Communicator& comm) -> absl::Status {
        char b = 0;
        absl::Status s = comm.Broadcast(&b, 1, 5, Deadline());
        RETURN_IF_MISMATCH(s.code() == absl::StatusCode::kInvalidArgument, s.ToString());
        std::vector<size_t> counts(3, 1);
        s = comm.AllGatherV(&b, counts, &b, Deadline());
        RETURN_IF_MISMATCH(s.code() == absl::StatusCode::kInvalidArgument, s.ToString());
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
