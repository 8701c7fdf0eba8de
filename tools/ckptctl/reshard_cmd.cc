// ckptctl reshard: rewrite a checkpoint into the pieces of a target layout, in-process or on
// a cluster's workers (--coordinator).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "planner/layout_spec.h"
#include "reshard/offline_reshard.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/cluster_reshard.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/store_staging.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kCmd[] = "reshard";

// The in-process reshard's options from the command line; a usage error names the flag.
absl::StatusOr<OfflineReshardOptions> LocalOptions(const ParsedArgs& a) {
  CKPT_RETURN_IF_ERROR(
      RefuseFlags(a, {"max-workers", "timeout", "tls-ca", "tls-cert", "tls-key", "insecure"},
                  "applies only with --coordinator"));
  OfflineReshardOptions options;
  options.overwrite = a.Has("overwrite");
  options.verify_checksums = !a.Has("no-verify");
  CKPT_RETURN_IF_ERROR(SizeFlag(a, "memory-budget", 1, &options.memory_budget_bytes));
  CKPT_RETURN_IF_ERROR(IoFromFlags(a, &options.io));
  CKPT_ASSIGN_OR_RETURN(options.compression, ParseCompression(a.Get("compression")));
  options.compression.threads = options.io.num_threads;
  if (!a.Has("json") && isatty(STDERR_FILENO)) {
    options.progress = [](const WaveProgress& p) {
      std::fprintf(stderr, "\rwave %lld/%lld  %.1f%%", static_cast<long long>(p.wave),
                   static_cast<long long>(p.waves),
                   p.bytes_total ? 100.0 * p.bytes_done / p.bytes_total : 100.0);
      if (p.wave == p.waves) std::fputc('\n', stderr);
    };
  }
  return options;
}

// The cluster reshard's arguments from the command line; a usage error names the flag.
absl::StatusOr<ClusterReshardArgs> ClusterArgs(const ParsedArgs& a) {
  CKPT_RETURN_IF_ERROR(RefuseFlags(a,
                                   {"threads", "direct-io", "no-uring", "no-verify", "compression"},
                                   "applies only without --coordinator"));
  ClusterReshardArgs cluster;
  cluster.coordinator = a.Get("coordinator");
  cluster.tls = TlsFromArgs(a);
  cluster.source = a.positional[0];
  cluster.destination = a.positional[1];
  cluster.layout_path = a.Get("layout");
  cluster.overwrite = a.Has("overwrite");
  cluster.json = a.Has("json");
  CKPT_RETURN_IF_ERROR(SizeFlag(a, "memory-budget", 1, &cluster.memory_budget_bytes));
  CKPT_RETURN_IF_ERROR(IntFlag(a, "max-workers", 1, 1 << 20, &cluster.max_workers));
  CKPT_RETURN_IF_ERROR(DurationFlag(a, "timeout", &cluster.timeout));
  return cluster;
}

// The summary of an in-process reshard: one JSON object, or lines for people.
void PrintSummary(const std::string& src, const std::string& dst, const LayoutSpec& layout,
                  const OfflineReshardStats& stats, double seconds, bool json) {
  const double gbps = seconds > 0 ? stats.write.bytes_written / seconds / 1e9 : 0;
  const int64_t peak = stats.write.peak_wave_bytes + stats.peak_staging_bytes;
  if (json) {
    nlohmann::json j = {
        {"src", src},
        {"dst", dst},
        {"world_size", layout.world_size()},
        {"tensors", stats.tensors},
        {"src_pieces", stats.src_pieces},
        {"dst_pieces", stats.dst_pieces},
        {"files", stats.write.files},
        {"waves", stats.write.waves},
        {"bytes_read", stats.bytes_read},
        {"bytes_written", stats.write.bytes_written},
        {"peak_buffer_bytes", peak},
        {"plan_seconds", stats.plan_seconds},
        {"read_seconds", stats.read_seconds},
        {"fill_seconds", stats.write.fill_seconds},
        {"write_seconds", stats.write.write_seconds},
        {"commit_seconds", stats.write.commit_seconds},
        {"seconds", seconds},
        {"gb_per_s", gbps},
    };
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "resharded %s -> %s (%lld ranks)\n"
      "  tensors %lld, pieces %lld -> %lld, files %lld, waves %lld\n"
      "  read %s bytes, wrote %s bytes, peak buffers %s bytes\n"
      "  %.2f s (plan %.2f, read %.2f, write %.2f, commit %.2f), %.2f GB/s\n",
      src.c_str(), dst.c_str(), static_cast<long long>(layout.world_size()),
      static_cast<long long>(stats.tensors), static_cast<long long>(stats.src_pieces),
      static_cast<long long>(stats.dst_pieces), static_cast<long long>(stats.write.files),
      static_cast<long long>(stats.write.waves), absl::StrCat(stats.bytes_read).c_str(),
      absl::StrCat(stats.write.bytes_written).c_str(), absl::StrCat(peak).c_str(), seconds,
      stats.plan_seconds, stats.read_seconds, stats.write.write_seconds, stats.write.commit_seconds,
      gbps);
}

// Reads the layout, reshards in this process and prints the summary.
int RunLocalReshard(const ParsedArgs& a, const OfflineReshardOptions& options) {
  absl::StatusOr<LayoutSpec> layout = LayoutSpec::FromFile(a.Get("layout"));
  if (!layout.ok()) return Fail(kCmd, layout.status());
  const auto t0 = std::chrono::steady_clock::now();
  // An s3:// source is read in place (CheckpointReader: ranged GETs); an s3:// destination is
  // written to a private local directory, then copied up (tools/ckptctl/store_staging.h).
  auto dest = WritableCheckpoint::Create(a.positional[1], options.overwrite);
  if (!dest.ok()) return Fail(kCmd, dest.status());
  absl::StatusOr<OfflineReshardStats> stats =
      OfflineReshard(a.positional[0], (*dest)->path(), *layout, options);
  if (!stats.ok()) return Fail(kCmd, stats.status());
  if (absl::Status s = (*dest)->Publish(); !s.ok()) return Fail(kCmd, s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PrintSummary(a.positional[0], a.positional[1], *layout, *stats, seconds, a.Has("json"));
  return 0;
}

}  // namespace

const CommandSpec& ReshardSpec() {
  static const CommandSpec* spec = new CommandSpec{
      kCmd,
      "usage: ckptctl reshard <src> <dst> --layout <layout.json> [flags]",
      "Rewrites the committed checkpoint <src> into the pieces of a target layout (world size,\n"
      "device mesh, placements per tensor-name pattern; see docs/layout.md) as a new checkpoint\n"
      "<dst>, committed atomically. Runs in this process within a memory budget: only the byte\n"
      "spans of <src> that each destination piece needs are read (checksums verified), and\n"
      "destination files are written and checksummed in waves. Step and user metadata are\n"
      "carried over; the target layout is recorded as the saved layout.\n"
      "\n"
      "With --coordinator it runs on a cluster: the ranks of the target layout are spread over\n"
      "the live ckpt_worker daemons, each reading what its pieces need and writing its files;\n"
      "the coordinator commits. --memory-budget is then per rank; --threads, --direct-io,\n"
      "--no-uring and --no-verify apply only in-process; --max-workers, --timeout and the TLS\n"
      "flags only on a cluster.\n\n"
      "In-process, <src> and <dst> may be s3:// URLs: a URL <src> is read in place (ranged\n"
      "GETs of the spans needed, nothing written to local disk); a URL <dst> is written to a\n"
      "private temporary directory under $TMPDIR, then copied up verified and committed by the\n"
      "store (local disk for the whole destination checkpoint).\n"
      "On a cluster, URLs go to the coordinator as given.\n",
      With(With({{"layout", "FILE", "target layout (JSON), required"},
                 {"overwrite", "",
                  "replace an existing committed checkpoint at <dst> (anything\n"
                  "else there is refused and left as it is)"},
                 {"memory-budget", "SIZE",
                  "piece data held at once (default 1GiB; e.g. 512MiB, 4G)"},
                 {"no-verify", "", "do not verify source checksums while reading"},
                 {"compression", "SPEC",
                  "compress the destination's pieces: none (default), zstd or\n"
                  "zstd:<level> (byte-grouped zstd; not readable by a plain\n"
                  "safetensors reader; in-process only)"},
                 {"json", "", "print the summary as one JSON object"},
                 {"coordinator", "HOST:PORT", "run on this coordinator's workers"},
                 {"max-workers", "N", "cluster: use at most N workers (default: every live one)"},
                 {"timeout", "DURATION",
                  "cluster: give up waiting after this long (default 1h; e.g. 30m)"}},
                IoFlagSpecs()),
           TlsFlagSpecs()),
  };
  return *spec;
}

int RunReshardCommand(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(ReshardSpec(), args, &a)) return *code;
  if (a.positional.size() != 2) {
    return Usage(kCmd, absl::StrCat("expected <src> <dst>, got ", a.positional.size(), " paths"));
  }
  if (!a.Has("layout")) return Usage(kCmd, "--layout <layout.json> is required");
  if (a.Has("coordinator")) {
    absl::StatusOr<ClusterReshardArgs> cluster = ClusterArgs(a);
    if (!cluster.ok()) return Usage(kCmd, std::string(cluster.status().message()));
    return RunClusterReshard(*cluster);
  }
  absl::StatusOr<OfflineReshardOptions> options = LocalOptions(a);
  if (!options.ok()) return Usage(kCmd, std::string(options.status().message()));
  return RunLocalReshard(a, *options);
}

}  // namespace ckpt::ckptctl
