// ckpt_loadgen: N simulated trainer ranks over M simulated workers against a real coordinator
// (docs/BENCHMARKS.md, "Coordinator at scale"). See tools/loadgen/loadgen.h for what is and is
// not exercised.
//
//   ckpt_loadgen --ranks 10240 [--workers M] [--hosts H] [--layout tp8pp16] [--model gpt-175b]
//                (--spawn-coordinator PATH [--coordinator-flag F ...] |
//                 --coordinator HOST:PORT --checkpoint-root DIR [--coordinator-pid P]
//                 [--coordinator-log FILE])
//                [--operations save,load] [--repeat N] [--no-state-digest]
//                [--load-algorithm A] [--max-in-flight 256]
//                [--channels 64] [--executor-threads 2]
//                [--rank-waits per-worker|per-rank|none] [--no-rank-waits] [--fsync]
//                [--execute-while-dispatching]
//                [--max-coordinator-rss 12G] [--keep-checkpoint] [--operation-timeout-s 1800]
//                [--rpc-timeout-s 120]
//
// Exit status: 0 when every operation reached done, 1 otherwise, 2 for usage errors.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "proto/wire_names.h"
#include "storage/file_util.h"
#include "tools/loadgen/loadgen.h"

namespace {

constexpr char kUsage[] =
    "usage: ckpt_loadgen --ranks N [--workers M] [--hosts H] [--layout tp8pp16]\n"
    "                    [--model gpt-175b|small]\n"
    "                    (--spawn-coordinator PATH [--coordinator-flag F ...] |\n"
    "                     --coordinator HOST:PORT --checkpoint-root DIR [--coordinator-pid P]\n"
    "                     [--coordinator-log FILE])\n"
    "                    [--operations save,load] [--repeat N] [--no-state-digest] [--compact]\n"
    "                    [--load-algorithm A] [--max-in-flight 256]\n"
    "                    [--channels 64] [--executor-threads 2]\n"
    "                    [--rank-waits stream|per-worker|per-rank|none] [--no-rank-waits]\n"
    "                    [--fsync]\n"
    "                    [--per-rank-joins] [--no-join-linger] [--no-class-references]\n"
    "                    [--execute-while-dispatching]\n"
    "                    [--max-coordinator-rss 12G] [--keep-checkpoint]\n"
    "                    [--operation-timeout-s 1800] [--rpc-timeout-s 120]\n"
    "Simulates N trainer ranks (a GPT at TP x PP x DP) over M workers against a real\n"
    "ckpt_coordinator over gRPC; saves write sparse (all-zero) data files, loads read nothing.\n"
    "Prints gather/plan/dispatch/commit seconds and the coordinator's peak RSS, threads, CPU.\n"
    "--compact: ranks describe each tensor by its layout rule's placements over their mesh\n"
    "coordinate (RankState.compact_tensors), which the coordinator expands.\n"
    "--rank-waits: how ranks wait for an operation's end: stream (default, as workers do: told\n"
    "by the `ended` item on their worker's WatchWork stream, no call), per-worker (one\n"
    "WaitOperation at a time per worker, told to its ranks: workers before stream ends),\n"
    "per-rank (one per rank), none (--no-rank-waits is none).\n"
    "--per-rank-joins: each rank joins in its own JoinOperation call (workers before they\n"
    "coalesced joins); by default a worker's ranks join together in one JoinOperations call, as\n"
    "a worker does when its trainers arrive within its join linger.\n"
    "--no-join-linger: a worker's first rank joins alone and its other ranks together in the\n"
    "next call (a worker with --join_linger_ms=0).\n"
    "--no-class-references: every changed description goes in full (workers before they\n"
    "described their pieces by reference to their layout class).\n"
    "--execute-while-dispatching: each plan part is executed as it arrives; by default parts\n"
    "wait for the last rank's part, so the simulated workers' file writes (other hosts' work in\n"
    "a real deployment) do not share the coordinator's cores while it dispatches.\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "ckpt_loadgen: %s\n%s", error.c_str(), kUsage);
  return 2;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ParseBytes(absl::string_view text, int64_t* out) {
  int64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
        scale = int64_t{1} << 10;
        break;
      case 'M':
        scale = int64_t{1} << 20;
        break;
      case 'G':
        scale = int64_t{1} << 30;
        break;
      default:
        break;
    }
    if (scale > 1) text.remove_suffix(1);
  }
  return absl::SimpleAtoi(text, out) && *out >= 0 && (*out *= scale, true);
}

// A coordinator process this tool started; SIGTERM (then SIGKILL) when destroyed.
struct SpawnedCoordinator {
  pid_t pid = -1;
  std::string address;
  std::string log;

  ~SpawnedCoordinator() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

bool Spawn(const std::string& path, const std::string& dir, const std::string& root,
           const std::vector<std::string>& extra, SpawnedCoordinator* out) {
  const std::string address_file = dir + "/coordinator.address";
  out->log = dir + "/coordinator.log";
  std::vector<std::string> argv = {path, "--listen=127.0.0.1:0", "--address_file=" + address_file,
                                   "--checkpoint_root=" + root, "--log_level=info"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int log = open(out->log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(log, 2);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  out->pid = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    std::string address(absl::StripAsciiWhitespace(ReadFile(address_file)));
    if (!address.empty()) {
      out->address = address;
      return true;
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      out->pid = -1;
      return false;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

using Flags = std::map<std::string, std::string>;

// Reads the command line into `flags` (a boolean flag's value is "1") and the repeated
// --coordinator-flag values; the error names the bad argument.
absl::Status ParseCommandLine(int argc, char** argv, Flags* flags,
                              std::vector<std::string>* coordinator_flags) {
  const std::set<std::string> value_flags = {"ranks",
                                             "workers",
                                             "hosts",
                                             "layout",
                                             "model",
                                             "spawn-coordinator",
                                             "coordinator",
                                             "checkpoint-root",
                                             "coordinator-pid",
                                             "coordinator-log",
                                             "operations",
                                             "repeat",
                                             "load-algorithm",
                                             "max-in-flight",
                                             "channels",
                                             "executor-threads",
                                             "max-coordinator-rss",
                                             "operation-timeout-s",
                                             "coordinator-flag",
                                             "rpc-timeout-s",
                                             "rank-waits"};
  const std::set<std::string> bool_flags = {"no-rank-waits",       "fsync",
                                            "keep-checkpoint",     "help",
                                            "no-state-digest",     "compact",
                                            "per-rank-joins",      "no-join-linger",
                                            "no-class-references", "execute-while-dispatching"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", arg));
    }
    std::string name(arg.substr(0, arg.find('=')));
    std::string value;
    if (bool_flags.count(name)) {
      // A value would be ignored (--fsync=false turned fsync on): refused instead.
      if (name.size() != arg.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value (got '", arg,
                                                       "'); omit the flag to turn it off"));
      }
      (*flags)[name] = "1";
      continue;
    }
    if (!value_flags.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (arg.find('=') != absl::string_view::npos) {
      value = std::string(arg.substr(arg.find('=') + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    if (name == "coordinator-flag") {
      coordinator_flags->push_back(value);
    } else {
      (*flags)[name] = value;
    }
  }
  return absl::OkStatus();
}

// The run's options from the flags (all but the coordinator and checkpoint), the pid given by
// --coordinator-pid and the --max-coordinator-rss cap; the error says which flag is bad.
absl::Status ParseRunOptions(Flags& flags, ckpt::loadgen::LoadgenOptions* options, int64_t* pid,
                             int64_t* max_rss) {
  auto integer = [&](const std::string& name, int64_t fallback, int64_t* out) {
    if (!flags.count(name)) {
      *out = fallback;
      return true;
    }
    return absl::SimpleAtoi(flags[name], out) && *out >= 0;
  };
  int64_t max_in_flight, channels, executors, timeout_s, rpc_timeout_s;
  if (!integer("ranks", 0, &options->ranks) || options->ranks < 1) {
    return absl::InvalidArgumentError("--ranks must be a positive integer");
  }
  if (!integer("workers", options->ranks, &options->workers) ||
      !integer("hosts", 0, &options->hosts) || !integer("max-in-flight", 256, &max_in_flight) ||
      !integer("channels", 64, &channels) || !integer("executor-threads", 2, &executors) ||
      !integer("coordinator-pid", 0, pid) || !integer("operation-timeout-s", 1800, &timeout_s) ||
      !integer("rpc-timeout-s", 120, &rpc_timeout_s) || rpc_timeout_s < 1 || max_in_flight < 1 ||
      executors < 1) {
    return absl::InvalidArgumentError("bad integer flag");
  }
  options->max_in_flight = static_cast<int>(max_in_flight);
  options->channels = static_cast<int>(std::max<int64_t>(1, channels));
  options->executor_threads = static_cast<int>(executors);
  options->operation_timeout = absl::Seconds(timeout_s);
  options->rpc_timeout = absl::Seconds(rpc_timeout_s);
  if (flags.count("no-rank-waits")) {
    options->rank_waits = ckpt::loadgen::RankWaits::kNone;
  } else if (flags.count("rank-waits")) {
    absl::StatusOr<ckpt::loadgen::RankWaits> waits =
        ckpt::loadgen::ParseRankWaits(flags["rank-waits"]);
    if (!waits.ok()) return waits.status();
    options->rank_waits = *waits;
  }
  options->fsync = flags.count("fsync") > 0;
  options->execute_while_dispatching = flags.count("execute-while-dispatching") > 0;
  options->per_rank_joins = flags.count("per-rank-joins") > 0;
  options->join_linger = flags.count("no-join-linger") == 0;
  if (!flags["load-algorithm"].empty()) {
    absl::StatusOr<ckpt::pb::LoadAlgorithm> algorithm =
        ckpt::ParseLoadAlgorithm(flags["load-algorithm"]);
    if (!algorithm.ok()) return absl::InvalidArgumentError(algorithm.status().message());
    options->load_algorithm = *algorithm;
  }
  if (flags.count("operations")) {
    options->operations = absl::StrSplit(flags["operations"], ',', absl::SkipEmpty());
    for (const std::string& op : options->operations) {
      if (op != "save" && op != "load") {
        return absl::InvalidArgumentError(absl::StrCat("unknown operation ", op));
      }
    }
  }
  int64_t repeat = 1;
  if (flags.count("repeat") && (!absl::SimpleAtoi(flags["repeat"], &repeat) || repeat < 1)) {
    return absl::InvalidArgumentError("bad --repeat (a positive count)");
  }
  // --repeat N: the operations N times (repeat saves write new checkpoints; see SavePath).
  const std::vector<std::string> once = options->operations;
  for (int64_t i = 1; i < repeat; ++i) {
    options->operations.insert(options->operations.end(), once.begin(), once.end());
  }
  options->state_digests = !flags.count("no-state-digest");
  options->compact = flags.count("compact") > 0;
  options->class_references = !flags.count("no-class-references");
  if (flags.count("max-coordinator-rss") && !ParseBytes(flags["max-coordinator-rss"], max_rss)) {
    return absl::InvalidArgumentError("bad --max-coordinator-rss");
  }
  return absl::OkStatus();
}

// The simulated GPT's pipeline layout from --layout and --model.
absl::StatusOr<ckpt::loadgen::GptPipelineLayout> LayoutOfFlags(Flags& flags, int64_t ranks) {
  absl::StatusOr<ckpt::loadgen::Parallelism> parallel =
      ckpt::loadgen::ParseParallelism(flags.count("layout") ? flags["layout"] : "tp8pp16", ranks);
  if (!parallel.ok()) return parallel.status();
  absl::StatusOr<ckpt::GptConfig> model =
      ckpt::loadgen::ModelByName(flags.count("model") ? flags["model"] : "gpt-175b");
  if (!model.ok()) return model.status();
  return ckpt::loadgen::GptPipelineLayout::Create(*model, *parallel);
}

// The checkpoint root: --checkpoint-root, or a fresh scratch directory when the coordinator is
// spawned here.
absl::StatusOr<std::string> CheckpointRoot(Flags& flags, bool spawn) {
  std::string root = flags["checkpoint-root"];
  if (!root.empty()) return root;
  if (!spawn)
    return absl::InvalidArgumentError("--coordinator needs --checkpoint-root (under its root)");
  char scratch[] = "/tmp/ckpt-loadgen-XXXXXX";
  if (mkdtemp(scratch) == nullptr) {
    return absl::InvalidArgumentError("cannot create a scratch directory in /tmp");
  }
  return std::string(scratch);
}

// Starts the coordinator under `root` and points the options at it. Protects the shared
// machine: a coordinator growing past `max_rss` is stopped, and *over_cap says so.
bool StartCoordinator(Flags& flags, const std::vector<std::string>& coordinator_flags,
                      const std::string& root, int64_t max_rss, std::atomic<bool>* over_cap,
                      SpawnedCoordinator* spawned, ckpt::loadgen::LoadgenOptions* options) {
  if (!Spawn(flags["spawn-coordinator"], root, root, coordinator_flags, spawned)) {
    std::fprintf(stderr, "ckpt_loadgen: the coordinator did not start; its log: %s\n%s",
                 spawned->log.c_str(), ReadFile(spawned->log).c_str());
    return false;
  }
  options->coordinator = spawned->address;
  options->coordinator_pid = spawned->pid;
  options->coordinator_log = spawned->log;
  options->on_coordinator_sample = [over_cap, max_rss,
                                    pid = spawned->pid](const ckpt::loadgen::ProcStats& s) {
    if (s.rss_bytes > max_rss && !over_cap->exchange(true)) {
      kill(pid, SIGKILL);
      std::fprintf(stderr,
                   "ckpt_loadgen: coordinator RSS %lld bytes passed --max-coordinator-rss;"
                   " killed it\n",
                   static_cast<long long>(s.rss_bytes));
    }
  };
  return true;
}

// Prints the report and the verdict; returns whether every operation reached done.
bool PrintReport(const ckpt::loadgen::LoadgenOptions& options,
                 const ckpt::loadgen::LoadgenReport& report, bool over_cap, int64_t max_rss) {
  std::fputs(ckpt::loadgen::FormatReport(options, report).c_str(), stdout);
  if (over_cap) {
    std::printf("coordinator_killed rss above --max-coordinator-rss %lld bytes\n",
                static_cast<long long>(max_rss));
  }
  bool all_done = report.operations.size() == options.operations.size();
  for (const auto& op : report.operations) all_done = all_done && op.phase == "done";
  std::printf("result %s\n", all_done ? "ok" : "failed");
  return all_done;
}

}  // namespace

int main(int argc, char** argv) {
  ckpt::TurnOffMutexDeadlockDetection();  // the simulated ranks' gRPC calls lock absl mutexes
  Flags flags;
  std::vector<std::string> coordinator_flags;
  if (absl::Status s = ParseCommandLine(argc, argv, &flags, &coordinator_flags); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  if (flags.count("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  ckpt::loadgen::LoadgenOptions options;
  int64_t pid = 0;
  int64_t max_rss = int64_t{12} << 30;
  if (absl::Status s = ParseRunOptions(flags, &options, &pid, &max_rss); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  absl::StatusOr<ckpt::loadgen::GptPipelineLayout> layout = LayoutOfFlags(flags, options.ranks);
  if (!layout.ok()) return Usage(std::string(layout.status().message()));

  const bool spawn = flags.count("spawn-coordinator") > 0;
  if (spawn == (flags.count("coordinator") > 0)) {
    return Usage("give exactly one of --spawn-coordinator and --coordinator");
  }
  absl::StatusOr<std::string> root = CheckpointRoot(flags, spawn);
  if (!root.ok()) return Usage(std::string(root.status().message()));
  options.checkpoint = *root + "/loadgen-ckpt";
  const int saves = static_cast<int>(
      std::count(options.operations.begin(), options.operations.end(), std::string("save")));
  for (int n = 0; n < std::max(saves, 1); ++n) {
    const std::string path = ckpt::loadgen::SavePath(options, n);
    if (ckpt::PathExists(path))
      return Usage(absl::StrCat(path, " exists already; remove it first"));
  }
  SpawnedCoordinator spawned;
  std::atomic<bool> over_cap{false};
  if (spawn) {
    if (!StartCoordinator(flags, coordinator_flags, *root, max_rss, &over_cap, &spawned,
                          &options)) {
      return 1;
    }
  } else {
    options.coordinator = flags["coordinator"];
    options.coordinator_pid = static_cast<pid_t>(pid);
    options.coordinator_log = flags["coordinator-log"];
  }
  std::printf("ckpt_loadgen coordinator %s log %s checkpoint %s\n", options.coordinator.c_str(),
              options.coordinator_log.empty() ? "-" : options.coordinator_log.c_str(),
              options.checkpoint.c_str());
  std::fflush(stdout);
  absl::StatusOr<ckpt::loadgen::LoadgenReport> report = ckpt::loadgen::RunLoadgen(options, *layout);
  if (!report.ok()) {
    std::fprintf(stderr, "ckpt_loadgen: %s\n", report.status().ToString().c_str());
    return 1;
  }
  const bool all_done = PrintReport(options, *report, over_cap, max_rss);
  // The checkpoint goes; a scratch root stays for the coordinator's log (printed above).
  for (int n = 0; n < std::max(saves, 1) && !flags.count("keep-checkpoint"); ++n) {
    (void)ckpt::RemoveTree(ckpt::loadgen::SavePath(options, n));
  }
  std::fflush(stdout);
  return all_done ? 0 : 1;
}
