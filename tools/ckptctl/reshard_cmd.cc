// ckptctl reshard: rewrite a checkpoint into the pieces of a target layout, in-process or on
// a cluster's workers (--coordinator).
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "planner/layout_spec.h"
#include "reshard/offline_reshard.h"
#include "tools/ckptctl/cluster_reshard.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kHelp[] =
    "usage: ckptctl reshard <src> <dst> --layout <layout.json> [options]\n"
    "\n"
    "Rewrites the committed checkpoint <src> into the pieces of a target layout (world size,\n"
    "device mesh, placements per tensor-name pattern; see docs/layout.md) as a new checkpoint\n"
    "<dst>, committed atomically. Runs in this process within a memory budget: only the byte\n"
    "spans of <src> that each destination piece needs are read (checksums verified), and\n"
    "destination files are written and checksummed in waves. Step and user metadata are\n"
    "carried over; the target layout is recorded as the saved layout.\n"
    "\n"
    "options:\n"
    "  --layout FILE          target layout (JSON), required\n"
    "  --overwrite            replace an existing committed checkpoint at <dst> (anything\n"
    "                         else there is refused and left as it is)\n"
    "  --memory-budget BYTES  piece data held at once (default 1G; suffixes K, M, G, T)\n"
    "  --threads N            I/O threads (default 4)\n"
    "  --direct-io            O_DIRECT reads and writes (where the filesystem allows)\n"
    "  --no-verify            do not verify source checksums while reading\n"
    "  --json                 print the summary as one JSON object\n"
    "\n"
    "on a cluster (the ranks of the target layout spread over the live ckpt_worker daemons,\n"
    "each reading what its pieces need and writing its files; the coordinator commits):\n"
    "  --coordinator ADDR     the coordinator's host:port\n"
    "  --max-workers N        use at most N workers (default: every live one)\n"
    "  --timeout SECONDS      give up waiting after this long (default 3600)\n"
    "  (--memory-budget is then per rank; --threads, --direct-io, --no-verify do not apply)\n"
    "  TLS to the coordinator (see ckptctl certs --help):\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "ckptctl reshard: %s (see ckptctl reshard --help)\n", msg.c_str());
  return 2;
}

// "1073741824", "512M", "1G", "1.5GiB" -> bytes.
bool ParseBytes(std::string text, int64_t* out) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int64_t mult = 1;
  for (const auto& [suffix, m] : std::vector<std::pair<std::string, int64_t>>{{"KIB", 1LL << 10},
                                                                              {"MIB", 1LL << 20},
                                                                              {"GIB", 1LL << 30},
                                                                              {"TIB", 1LL << 40},
                                                                              {"KB", 1LL << 10},
                                                                              {"MB", 1LL << 20},
                                                                              {"GB", 1LL << 30},
                                                                              {"TB", 1LL << 40},
                                                                              {"K", 1LL << 10},
                                                                              {"M", 1LL << 20},
                                                                              {"G", 1LL << 30},
                                                                              {"T", 1LL << 40},
                                                                              {"B", 1}}) {
    if (text.size() > suffix.size() &&
        text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      text.resize(text.size() - suffix.size());
      mult = m;
      break;
    }
  }
  double v = 0;
  if (!absl::SimpleAtod(text, &v) || v <= 0 || v * mult > 9.0e18) return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

}  // namespace

int RunReshardCommand(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  const std::vector<std::string> bool_flags = {"overwrite", "direct-io", "no-verify", "json",
                                               "help"};
  const std::vector<std::string> value_flags = {"layout",      "memory-budget", "threads",
                                                "coordinator", "max-workers",   "timeout"};
  TlsFlags tls;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (ConsumeTlsFlag(args, &i, &tls)) {
      flags["tls"] = "1";
      continue;
    }
    if (a == "-h") {
      flags["help"] = "1";
      continue;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (std::find(bool_flags.begin(), bool_flags.end(), name) != bool_flags.end()) {
      if (has_value) return Usage(absl::StrCat("--", name, " takes no value"));
      flags[name] = "1";
    } else if (std::find(value_flags.begin(), value_flags.end(), name) != value_flags.end()) {
      if (!has_value) {
        if (i + 1 >= args.size()) return Usage(absl::StrCat("--", name, " needs a value"));
        value = args[++i];
      }
      flags[name] = value;
    } else {
      return Usage(absl::StrCat("unknown option ", a));
    }
  }
  if (flags.count("help")) {
    std::fputs(kHelp, stdout);
    std::fputs(kTlsHelp, stdout);
    return 0;
  }
  if (positional.size() != 2) {
    return Usage(absl::StrCat("expected <src> <dst>, got ", positional.size(), " paths"));
  }
  if (!flags.count("layout")) return Usage("--layout <layout.json> is required");

  if (flags.count("coordinator")) {
    ClusterReshardArgs cluster;
    cluster.coordinator = flags["coordinator"];
    cluster.tls = tls;
    cluster.source = positional[0];
    cluster.destination = positional[1];
    cluster.layout_path = flags["layout"];
    cluster.overwrite = flags.count("overwrite") > 0;
    cluster.json = flags.count("json") > 0;
    for (const char* local : {"threads", "direct-io", "no-verify"}) {
      if (flags.count(local)) {
        return Usage(absl::StrCat("--", local, " applies only without --coordinator"));
      }
    }
    if (flags.count("memory-budget") &&
        !ParseBytes(flags["memory-budget"], &cluster.memory_budget_bytes)) {
      return Usage(absl::StrCat("bad --memory-budget \"", flags["memory-budget"], "\""));
    }
    if (flags.count("max-workers") &&
        (!absl::SimpleAtoi(flags["max-workers"], &cluster.max_workers) ||
         cluster.max_workers < 1)) {
      return Usage(absl::StrCat("bad --max-workers \"", flags["max-workers"], "\""));
    }
    if (flags.count("timeout") &&
        (!absl::SimpleAtoi(flags["timeout"], &cluster.timeout_s) || cluster.timeout_s < 1)) {
      return Usage(absl::StrCat("bad --timeout \"", flags["timeout"], "\""));
    }
    return RunClusterReshard(cluster);
  }
  for (const char* cluster_only : {"max-workers", "timeout", "tls"}) {
    if (flags.count(cluster_only)) {
      return Usage(absl::StrCat("--", cluster_only, " applies only with --coordinator"));
    }
  }
  OfflineReshardOptions options;
  options.overwrite = flags.count("overwrite") > 0;
  options.verify_checksums = flags.count("no-verify") == 0;
  options.io.direct_io = flags.count("direct-io") > 0;
  if (flags.count("memory-budget") &&
      !ParseBytes(flags["memory-budget"], &options.memory_budget_bytes)) {
    return Usage(absl::StrCat("bad --memory-budget \"", flags["memory-budget"], "\""));
  }
  if (flags.count("threads")) {
    if (!absl::SimpleAtoi(flags["threads"], &options.io.num_threads) ||
        options.io.num_threads < 1 || options.io.num_threads > 256) {
      return Usage(absl::StrCat("bad --threads \"", flags["threads"], "\" (1..256)"));
    }
  }
  const bool json = flags.count("json") > 0;
  if (!json && isatty(STDERR_FILENO)) {
    options.progress = [](const WaveProgress& p) {
      std::fprintf(stderr, "\rwave %lld/%lld  %.1f%%", static_cast<long long>(p.wave),
                   static_cast<long long>(p.waves),
                   p.bytes_total ? 100.0 * p.bytes_done / p.bytes_total : 100.0);
      if (p.wave == p.waves) std::fputc('\n', stderr);
    };
  }

  absl::StatusOr<LayoutSpec> layout = LayoutSpec::FromFile(flags["layout"]);
  if (!layout.ok()) {
    std::fprintf(stderr, "ckptctl reshard: %s\n", std::string(layout.status().message()).c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<OfflineReshardStats> stats =
      OfflineReshard(positional[0], positional[1], *layout, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!stats.ok()) {
    std::fprintf(stderr, "ckptctl reshard: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  const double gbps = seconds > 0 ? stats->write.bytes_written / seconds / 1e9 : 0;
  if (json) {
    nlohmann::json j = {
        {"src", positional[0]},
        {"dst", positional[1]},
        {"world_size", layout->world_size()},
        {"tensors", stats->tensors},
        {"src_pieces", stats->src_pieces},
        {"dst_pieces", stats->dst_pieces},
        {"files", stats->write.files},
        {"waves", stats->write.waves},
        {"bytes_read", stats->bytes_read},
        {"bytes_written", stats->write.bytes_written},
        {"peak_buffer_bytes", stats->write.peak_wave_bytes + stats->peak_staging_bytes},
        {"plan_seconds", stats->plan_seconds},
        {"read_seconds", stats->read_seconds},
        {"fill_seconds", stats->write.fill_seconds},
        {"write_seconds", stats->write.write_seconds},
        {"commit_seconds", stats->write.commit_seconds},
        {"seconds", seconds},
        {"gb_per_s", gbps},
    };
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf(
      "resharded %s -> %s (%lld ranks)\n"
      "  tensors %lld, pieces %lld -> %lld, files %lld, waves %lld\n"
      "  read %s bytes, wrote %s bytes, peak buffers %s bytes\n"
      "  %.2f s (plan %.2f, read %.2f, write %.2f, commit %.2f), %.2f GB/s\n",
      positional[0].c_str(), positional[1].c_str(), static_cast<long long>(layout->world_size()),
      static_cast<long long>(stats->tensors), static_cast<long long>(stats->src_pieces),
      static_cast<long long>(stats->dst_pieces), static_cast<long long>(stats->write.files),
      static_cast<long long>(stats->write.waves), absl::StrCat(stats->bytes_read).c_str(),
      absl::StrCat(stats->write.bytes_written).c_str(),
      absl::StrCat(stats->write.peak_wave_bytes + stats->peak_staging_bytes).c_str(), seconds,
      stats->plan_seconds, stats->read_seconds, stats->write.write_seconds,
      stats->write.commit_seconds, gbps);
  return 0;
}

}  // namespace ckpt::ckptctl
