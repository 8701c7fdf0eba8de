// One rank of a multi-process exchange test: joins a Gloo group through the coordinator's
// rendezvous service (gRPC store), runs an exchange algorithm on a deterministic scenario and
// checks every byte against the single-process reference.
//
// Flags (all --name=value): store, rank, size, group, algorithm, seed, scale, reshard (0/1),
// budget, timeout_ms, exit_at (>0: _exit(17) on that communicator call, simulating a crash).
// Exit codes: 0 match, 1 wrong bytes, 2 exchange error (message on stderr), 3 bad flags.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "exchange/exchange.h"
#include "exchange/exchange_testing.h"
#include "exchange/gloo/gloo_communicator.h"
#include "rendezvous/grpc_store.h"

namespace ckpt {
namespace {

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      fprintf(stderr, "bad flag %s (expected --name=value)\n", a.c_str());
      return 3;
    }
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  auto num = [&](const std::string& name, int64_t fallback) {
    int64_t v = fallback;
    auto it = flags.find(name);
    if (it != flags.end() && !absl::SimpleAtoi(it->second, &v)) v = fallback;
    return v;
  };
  const int rank = num("rank", -1), size = num("size", 0);
  const std::string algorithm = flags["algorithm"];
  const absl::Duration timeout = absl::Milliseconds(num("timeout_ms", 20000));
  const int exit_at = num("exit_at", 0);

  ScenarioOptions so;
  so.num_ranks = size;
  so.seed = num("seed", 1);
  so.scale = num("scale", 1);
  so.reshard = num("reshard", 0) != 0;
  Scenario sc = MakeScenario(so);

  GrpcStore store(flags["store"]);
  GlooOptions go;
  go.group_name = flags["group"];
  absl::Time deadline = absl::Now() + timeout;
  auto comm = CreateGlooCommunicator(&store, rank, size, go, deadline);
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<Communicator> c = std::move(*comm);
  if (exit_at > 0) {
    c = std::make_unique<FaultInjectingCommunicator>(
        std::move(c), exit_at, [](std::unique_ptr<Communicator>&) -> absl::Status { _exit(17); });
  }
  ExchangeOptions options;
  options.memory_budget_bytes = num("budget", int64_t{1} << 30);
  options.deadline = deadline;
  ExchangeReport report;
  auto out = ExchangeByDistribution(algorithm, *c, sc.plan, sc.loaded[rank], options, &report);
  if (!out.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, out.status().ToString().c_str());
    return 2;
  }
  ShardBuffers expected = ReferenceOutputs(sc.plan, rank);
  if (*out != expected) {
    for (const auto& [id, bytes] : expected) {
      auto it = out->find(id);
      if (it == out->end() || it->second != bytes) {
        fprintf(stderr, "rank %d: shard %s differs from the reference\n", rank,
                id.DebugString().c_str());
      }
    }
    return 1;
  }
  printf("rank %d ok: %s, %zu waves, %lld bytes sent, %lld received\n", rank, algorithm.c_str(),
         report.waves.size(), static_cast<long long>(report.bytes_sent()),
         static_cast<long long>(report.bytes_received()));
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
