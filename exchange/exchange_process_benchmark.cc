// The same collectives as tools/bench/torch_gloo_peer.py, measured the same way (one process
// per rank, barrier, op, barrier; median over repetitions on rank 0), so the two are directly
// comparable. The parent serves the rendezvous store over gRPC on loopback and execs itself
// once per rank.
//
// Usage: exchange_process_benchmark [--ranks=2,4] [--mib=64] [--reps=20]
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "coordinator/kv_store.h"
#include "coordinator/rendezvous_service.h"
#include "exchange/exchange.h"
#include "exchange/gloo/gloo_communicator.h"
#include "exchange/grpc_store.h"
#include "exchange/reshard_bench_plan.h"

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
double Time(Communicator& c, int reps, const std::function<void()>& op) {
  op();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    Check(c.Barrier(Deadline()));
    absl::Time start = absl::Now();
    op();
    Check(c.Barrier(Deadline()));
    t.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int RankMain(const std::string& store_address, int rank, int n, int64_t bytes, int reps) {
  GrpcStore store(store_address);
  GlooOptions go;
  go.group_name = absl::StrCat("procbench_n", n);
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
  // Wire bytes of the reshard, summed over ranks.
  std::vector<int64_t> all(n);
  Check(c.AllGather(&wire, sizeof(wire), all.data(), Deadline()));
  for (int64_t w : all) rows.back().moved += w;
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
  if (flags.count("rank")) {
    return RankMain(flags["store"], num("rank", 0), num("size", 1), bytes, reps);
  }
  KvStore kv;
  RendezvousService service(&kv);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  printf("%-13s %5s %10s %8s\n", "collective", "ranks", "median ms", "GiB/s");
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
                                       absl::StrCat("--reps=", reps)};
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
