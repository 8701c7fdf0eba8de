// The same collectives as tools/bench/torch_gloo_peer.py, measured the same way (one process
// per rank, barrier, op, barrier; median over repetitions on rank 0), so the two are directly
// comparable. The parent serves the rendezvous store over gRPC on loopback and execs itself
// once per rank.
//
// Rows: barrier_only (barrier, nothing, barrier), broadcast, all_gather_v, all_to_all_v,
// overlap_a2a (ExchangeOverlapAllToAll: the row->column reshard of RowsToColumnsReshardPlan,
// allocating fresh outputs every call, as the PyTorch peer's overlap_reshard row does) and
// overlap_into (ExchangeOverlapAllToAllInto: the same reshard scattered into destinations the
// caller allocated once, staging from a caller-owned StagingArena: the worker's path). The
// parent first measures the limits in the same run: memcpy and one loopback TCP stream.
//
// Usage: exchange_process_benchmark [--ranks=2,4] [--mib=64] [--reps=20] [--huge_pages=1]
//        [--reuse_arena=1]   (0: overlap_into maps its staging per call instead)
//        [--trailing_barrier=1]  (0: time the op alone on rank 0, no closing barrier)
//        [--loop_nice=10]    (GlooOptions::loop_thread_nice)
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "exchange/exchange.h"
#include "exchange/gloo/gloo_communicator.h"
#include "exchange/reshard_bench_plan.h"
#include "rendezvous/grpc_store.h"
#include "rendezvous/kv_store.h"
#include "rendezvous/rendezvous_service.h"

namespace ckpt {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    _exit(2);
  }
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(120); }

// Median seconds of `reps` runs of op, bracketed by barriers.
bool trailing_barrier = true;
int loop_nice = GlooOptions().loop_thread_nice;

double Time(Communicator& c, int reps, const std::function<void()>& op) {
  op();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    Check(c.Barrier(Deadline()));
    absl::Time start = absl::Now();
    op();
    if (trailing_barrier) Check(c.Barrier(Deadline()));
    t.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds of `reps` single-thread memcpys of `bytes` (buffers touched beforehand).
double MemcpySeconds(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> t;
  for (int i = 0; i <= reps; ++i) {
    absl::Time start = absl::Now();
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
    if (i > 0) t.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds to push `bytes` through one TCP stream over 127.0.0.1 (writer and reader
// threads, 4 MiB reads), the transport's ceiling.
double LoopbackTcpSeconds(size_t bytes, int reps) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      listen(listener, 1) != 0) {
    return 0;
  }
  int sender = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  int receiver = accept(listener, nullptr, nullptr);
  std::vector<char> out(bytes, 7), in(4 << 20, 0);
  std::vector<double> t;
  for (int i = 0; i <= reps; ++i) {
    absl::Time start = absl::Now();
    std::thread reader([&] {
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = read(receiver, in.data(), std::min(in.size(), bytes - got));
        if (n <= 0) _exit(4);
        got += n;
      }
    });
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t n = write(sender, out.data() + sent, bytes - sent);
      if (n <= 0) _exit(4);
      sent += n;
    }
    reader.join();
    if (i > 0) t.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  close(sender);
  close(receiver);
  close(listener);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int RankMain(const std::string& store_address, int rank, int n, int64_t bytes, int reps,
             bool huge_pages, bool reuse_arena) {
  GrpcStore store(store_address);
  GlooOptions go;
  go.group_name = absl::StrCat("procbench_n", n);
  go.loop_thread_nice = loop_nice;
  auto comm = CreateGlooCommunicator(&store, rank, n, go, Deadline());
  Check(comm.status());
  Communicator& c = **comm;
  std::vector<char> buf(bytes, static_cast<char>(rank));
  const size_t part = bytes / n;
  std::vector<size_t> counts(n, part);
  std::vector<char> mine(part, static_cast<char>(rank)), gathered(part * n);
  const size_t per_peer = bytes / (n * n);
  std::vector<size_t> a2a(n, per_peer);
  std::vector<char> a2a_in(per_peer * n, 1), a2a_out(per_peer * n);
  std::vector<ShardBuffers> loaded;
  ExchangePlan plan = RowsToColumnsReshardPlan(n, bytes, &loaded);
  int64_t wire = 0;
  struct Row {
    const char* name;
    double seconds;
    int64_t moved;
  };
  std::vector<Row> rows;
  rows.push_back({"barrier_only", Time(c, reps, [] {}), 0});
  rows.push_back({"broadcast",
                  Time(c, reps, [&] { Check(c.Broadcast(buf.data(), bytes, 0, Deadline())); }),
                  bytes});
  rows.push_back(
      {"all_gather_v",
       Time(c, reps,
            [&] { Check(c.AllGatherV(mine.data(), counts, gathered.data(), Deadline())); }),
       static_cast<int64_t>(part * n)});
  rows.push_back(
      {"all_to_all_v",
       Time(c, reps,
            [&] { Check(c.AllToAllV(a2a_in.data(), a2a, a2a_out.data(), a2a, Deadline())); }),
       static_cast<int64_t>(per_peer * n * (n - 1))});
  rows.push_back(
      {"overlap_a2a",
       Time(c, reps,
            [&] {
              ExchangeOptions options;
              options.deadline = Deadline();
              ExchangeReport report;
              Check(ExchangeOverlapAllToAll(c, plan, loaded[rank], options, &report).status());
              wire = report.bytes_received();
            }),
       0});
  // The same reshard into destinations allocated (and touched) once, staging kept across
  // calls in a caller-owned arena.
  ShardBuffers outputs;
  for (const PieceSpec& need : plan.needs[rank]) {
    outputs[need.id] = std::string(need.NumBytes(), '\0');
  }
  const DestinationBuffers destinations = DestinationsOf(outputs);
  StagingArena arena(huge_pages);
  rows.push_back({"overlap_into",
                  Time(c, reps,
                       [&] {
                         ExchangeOptions options;
                         options.deadline = Deadline();
                         options.staging = reuse_arena ? &arena : nullptr;
                         Check(ExchangeOverlapAllToAllInto(c, plan, loaded[rank], destinations,
                                                           options, nullptr));
                       }),
                  0});
  // Wire bytes of the reshard, summed over ranks.
  std::vector<int64_t> all(n);
  Check(c.AllGather(&wire, sizeof(wire), all.data(), Deadline()));
  for (int64_t w : all) {
    rows[rows.size() - 2].moved += w;
    rows.back().moved += w;
  }
  if (rank == 0) {
    for (const Row& r : rows) {
      printf("%-13s %5d %10.1f %8.2f\n", r.name, n, r.seconds * 1e3,
             r.moved / r.seconds / (1 << 30));
    }
    fflush(stdout);
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    if (kv.first.rfind("--", 0) == 0) flags[kv.first.substr(2)] = kv.second;
  }
  auto num = [&](const char* name, int64_t fallback) {
    int64_t v = fallback;
    if (flags.count(name) && !absl::SimpleAtoi(flags[name], &v)) v = fallback;
    return v;
  };
  const int64_t bytes = num("mib", 64) << 20;
  const int reps = num("reps", 20);
  const bool huge_pages = num("huge_pages", 1) != 0;
  const bool reuse_arena = num("reuse_arena", 1) != 0;
  trailing_barrier = num("trailing_barrier", 1) != 0;
  loop_nice = num("loop_nice", loop_nice);
  if (flags.count("rank")) {
    return RankMain(flags["store"], num("rank", 0), num("size", 1), bytes, reps, huge_pages,
                    reuse_arena);
  }
  KvStore kv;
  RendezvousService service(&kv);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  printf("%-13s %5s %10s %8s\n", "collective", "ranks", "median ms", "GiB/s");
  const double memcpy_s = MemcpySeconds(bytes, reps);
  const double tcp_s = LoopbackTcpSeconds(bytes, reps);
  printf("%-13s %5s %10.1f %8.2f\n", "memcpy_limit", "-", memcpy_s * 1e3,
         bytes / memcpy_s / (1 << 30));
  printf("%-13s %5s %10.1f %8.2f\n", "loopback_tcp", "-", tcp_s * 1e3,
         tcp_s > 0 ? bytes / tcp_s / (1 << 30) : 0.0);
  fflush(stdout);
  std::string ranks = flags.count("ranks") ? flags["ranks"] : "2,4";
  for (absl::string_view n_text : absl::StrSplit(ranks, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(n_text, &n) || n < 1) return 3;
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> args = {"/proc/self/exe",
                                       absl::StrCat("--store=127.0.0.1:", port),
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--size=", n),
                                       absl::StrCat("--mib=", bytes >> 20),
                                       absl::StrCat("--reps=", reps),
                                       absl::StrCat("--huge_pages=", huge_pages ? 1 : 0),
                                       absl::StrCat("--reuse_arena=", reuse_arena ? 1 : 0),
                                       absl::StrCat("--trailing_barrier=", trailing_barrier),
                                       absl::StrCat("--loop_nice=", loop_nice)};
      pid_t pid = fork();
      if (pid == 0) {
        std::vector<char*> argv_child;
        for (std::string& a : args) argv_child.push_back(a.data());
        argv_child.push_back(nullptr);
        execv(argv_child[0], argv_child.data());
        _exit(127);
      }
      pids.push_back(pid);
    }
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  }
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
