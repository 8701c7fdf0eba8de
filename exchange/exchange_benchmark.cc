// Throughput of the Gloo data plane on loopback, next to its limits measured in the same run:
//   BM_Memcpy            single-thread memcpy bandwidth
//   BM_LoopbackTcp       one TCP stream over 127.0.0.1 (the transport's ceiling)
//   BM_Broadcast         Communicator::Broadcast from rank 0 (bytes = payload size)
//   BM_AllGatherV        Communicator::AllGatherV, uneven contributions (bytes = gathered size)
//   BM_AllToAllV        Communicator::AllToAllV, total/N^2 bytes per pair (bytes = wire bytes)
//   BM_OverlapAllToAll   ExchangeOverlapAllToAll: row-chunked F32 matrix resharded to column
//                        chunks (bytes = bytes that cross the wire, summed over ranks)
//   BM_OverlapAllToAllInto  the same into destinations allocated once, with a staging arena
// Ranks are threads of this process, each with its own Gloo TCP communicator.
// Run: bazel run -c opt //exchange:exchange_benchmark -- --benchmark_min_time=1
// Peer: tools/bench/torch_gloo_peer.py does the same collectives with PyTorch's Gloo backend.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "exchange/exchange.h"
#include "exchange/gloo/gloo_communicator.h"
#include "exchange/reshard_bench_plan.h"
#include "rendezvous/store.h"

namespace ckpt {
namespace {

// N persistent rank threads with Gloo communicators; Run() executes one step on all ranks.
class RankGroup {
 public:
  explicit RankGroup(int n) : n_(n) {
    static int counter = 0;
    const std::string group = absl::StrCat("bench", ++counter);
    comms_.resize(n);
    for (int r = 0; r < n; ++r) {
      threads_.emplace_back([this, r, group] {
        GlooOptions options;
        options.group_name = group;
        auto comm =
            CreateGlooCommunicator(&store_, r, n_, options, absl::Now() + absl::Seconds(60));
        if (!comm.ok()) {
          fprintf(stderr, "rank %d: %s\n", r, comm.status().ToString().c_str());
          std::abort();
        }
        comms_[r] = std::move(*comm);
        Loop(r);
      });
    }
  }

  ~RankGroup() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      ++generation_;
    }
    for (auto& t : threads_) t.join();
  }

  // Runs step(rank, comm) on every rank and waits for all.
  void Run(std::function<void(int, Communicator&)> step) {
    absl::MutexLock lock(&mu_);
    step_ = std::move(step);
    done_ = 0;
    ++generation_;
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == n_; };
    mu_.Await(absl::Condition(&all_done));
  }

 private:
  void Loop(int r) {
    int64_t seen = 0;
    while (true) {
      std::function<void(int, Communicator&)> step;
      {
        absl::MutexLock lock(&mu_);
        auto advanced = [this, &seen]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != seen; };
        mu_.Await(absl::Condition(&advanced));
        seen = generation_;
        if (stop_) return;
        step = step_;
      }
      step(r, *comms_[r]);
      absl::MutexLock lock(&mu_);
      ++done_;
    }
  }

  const int n_;
  InMemoryStore store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(int, Communicator&)> step_;
};

RankGroup& Group(int n) {
  static std::map<int, std::unique_ptr<RankGroup>>* groups =
      new std::map<int, std::unique_ptr<RankGroup>>();
  auto& g = (*groups)[n];
  if (!g) g = std::make_unique<RankGroup>(n);
  return *g;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(120); }

void BM_Memcpy(benchmark::State& state) {
  const size_t size = state.range(0);
  std::vector<char> src(size, 1), dst(size, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), size);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * size);
}
BENCHMARK(BM_Memcpy)->Arg(64 << 20)->Unit(benchmark::kMillisecond);

// One TCP stream from a sender to a receiver thread over 127.0.0.1.
void BM_LoopbackTcp(benchmark::State& state) {
  const size_t size = state.range(0);
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  int sender = socket(AF_INET, SOCK_STREAM, 0);
  connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int receiver = accept(listener, nullptr, nullptr);
  std::vector<char> out(size, 7), in(4 << 20);
  for (auto _ : state) {
    std::thread reader([&] {
      size_t got = 0;
      while (got < size) {
        ssize_t n = read(receiver, in.data(), std::min(in.size(), size - got));
        if (n <= 0) std::abort();
        got += n;
      }
    });
    size_t sent = 0;
    while (sent < size) {
      ssize_t n = write(sender, out.data() + sent, size - sent);
      if (n <= 0) std::abort();
      sent += n;
    }
    reader.join();
  }
  state.SetBytesProcessed(state.iterations() * size);
  close(sender);
  close(receiver);
  close(listener);
}
BENCHMARK(BM_LoopbackTcp)->Arg(64 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Broadcast(benchmark::State& state) {
  const int n = state.range(0);
  const size_t size = state.range(1);
  RankGroup& group = Group(n);
  std::vector<std::vector<char>> bufs(n, std::vector<char>(size, 1));
  for (auto _ : state) {
    group.Run(
        [&](int r, Communicator& c) { Check(c.Broadcast(bufs[r].data(), size, 0, Deadline())); });
  }
  state.SetBytesProcessed(state.iterations() * size);
}
BENCHMARK(BM_Broadcast)
    ->Args({2, 64 << 20})
    ->Args({4, 64 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AllGatherV(benchmark::State& state) {
  const int n = state.range(0);
  const size_t total = state.range(1);
  RankGroup& group = Group(n);
  std::vector<size_t> counts(n);
  size_t sum = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = r == n - 1 ? total - sum : total / n + (r % 2 ? 4099 : -4099);
    sum += counts[r];
  }
  std::vector<std::vector<char>> send(n), recv(n, std::vector<char>(total));
  for (int r = 0; r < n; ++r) send[r].assign(counts[r], static_cast<char>(r));
  for (auto _ : state) {
    group.Run([&](int r, Communicator& c) {
      Check(c.AllGatherV(send[r].data(), counts, recv[r].data(), Deadline()));
    });
  }
  state.SetBytesProcessed(state.iterations() * total);
}
BENCHMARK(BM_AllGatherV)
    ->Args({2, 64 << 20})
    ->Args({4, 64 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Raw Communicator::AllToAllV with the wire bytes of the reshard below (each rank sends
// total / N^2 to every peer), as torch's all_to_all_single in the peer script.
void BM_AllToAllV(benchmark::State& state) {
  const int n = state.range(0);
  const size_t total = state.range(1);
  const size_t per_peer = total / (n * n);
  RankGroup& group = Group(n);
  std::vector<size_t> counts(n, per_peer);
  std::vector<std::vector<char>> send(n, std::vector<char>(per_peer * n, 1)),
      recv(n, std::vector<char>(per_peer * n));
  for (auto _ : state) {
    group.Run([&](int r, Communicator& c) {
      Check(c.AllToAllV(send[r].data(), counts, recv[r].data(), counts, Deadline()));
    });
  }
  state.SetBytesProcessed(state.iterations() * per_peer * n * (n - 1));
}
BENCHMARK(BM_AllToAllV)
    ->Args({2, 64 << 20})
    ->Args({4, 64 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Reports the bytes all ranks received in one iteration (`wire`, per rank) as throughput.
void ReportWireBytes(benchmark::State& state, const std::vector<int64_t>& wire) {
  int64_t moved = 0;
  for (int64_t w : wire) moved += w;
  state.SetBytesProcessed(state.iterations() * moved);
  state.counters["wire_MiB"] = moved / 1048576.0;
}

// Rows stored in N chunks (rank i loads chunk i); every rank needs column chunk i.
void BM_OverlapAllToAll(benchmark::State& state) {
  const int n = state.range(0);
  const int64_t bytes = state.range(1);
  std::vector<ShardBuffers> loaded;
  const ExchangePlan plan = RowsToColumnsReshardPlan(n, bytes, &loaded);
  RankGroup& group = Group(n);
  std::vector<int64_t> wire(n);
  for (auto _ : state) {
    group.Run([&](int r, Communicator& c) {
      ExchangeOptions options;
      options.deadline = Deadline();
      options.memory_budget_bytes = int64_t{256} << 20;
      ExchangeReport report;
      auto out = ExchangeOverlapAllToAll(c, plan, loaded[r], options, &report);
      Check(out.status());
      wire[r] = report.bytes_received();
    });
  }
  ReportWireBytes(state, wire);
}
BENCHMARK(BM_OverlapAllToAll)
    ->Args({2, 64 << 20})
    ->Args({4, 64 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same reshard scattered into destinations allocated once (the worker's path), staging
// kept across iterations in one arena per rank.
void BM_OverlapAllToAllInto(benchmark::State& state) {
  const int n = state.range(0);
  const int64_t bytes = state.range(1);
  std::vector<ShardBuffers> loaded;
  const ExchangePlan plan = RowsToColumnsReshardPlan(n, bytes, &loaded);
  RankGroup& group = Group(n);
  std::vector<ShardBuffers> outputs(n);
  std::vector<DestinationBuffers> destinations(n);
  std::vector<std::unique_ptr<StagingArena>> arenas;
  for (int r = 0; r < n; ++r) {
    for (const PieceSpec& need : plan.needs[r]) {
      outputs[r][need.id] = std::string(need.NumBytes(), '\0');
    }
    destinations[r] = DestinationsOf(outputs[r]);
    arenas.push_back(std::make_unique<StagingArena>());
  }
  std::vector<int64_t> wire(n);
  for (auto _ : state) {
    group.Run([&](int r, Communicator& c) {
      ExchangeOptions options;
      options.deadline = Deadline();
      options.memory_budget_bytes = int64_t{256} << 20;
      options.staging = arenas[r].get();
      ExchangeReport report;
      Check(ExchangeOverlapAllToAllInto(c, plan, loaded[r], destinations[r], options, &report));
      wire[r] = report.bytes_received();
    });
  }
  ReportWireBytes(state, wire);
}
BENCHMARK(BM_OverlapAllToAllInto)
    ->Args({2, 64 << 20})
    ->Args({4, 64 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ckpt

BENCHMARK_MAIN();
