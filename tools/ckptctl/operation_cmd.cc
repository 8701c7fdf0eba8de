// `ckptctl save|load --coordinator HOST:PORT --job J <checkpoint>`: operator-requested save or
// load of a running job. The job's trainers perform it at their next Client::Poll; the command
// waits for the end (the commit, for a save), shows progress, and prints a summary.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/operation_phase.h"
#include "proto/wire_names.h"
#include "storage/piece_codec.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/coordinator_channel.h"
#include "tools/ckptctl/operation_wait.h"

namespace ckpt::ckptctl {
namespace {

// What `save` or `load` was asked to do.
struct OperationArgs {
  pb::OperationKind kind;
  const char* name;  // "save" or "load"
  std::string coordinator, job, path;
  TlsFlags tls;
  absl::Duration timeout = absl::Hours(1);
  absl::Duration arrival_deadline = absl::ZeroDuration();  // zero: the coordinator's
  pb::LoadAlgorithm algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED;
  int64_t memory_budget = 0;  // zero: the coordinator's
  std::string persist_to;     // memory saves: background persistence to storage ("": none)
  bool persist_overwrite = false;
  std::string process_groups;  // "": the trainers' (planner/process_groups.h)
  int memory_replicas = -1;    // memory saves: extra copies (-1: the trainers' or the default)
  std::string compression;     // storage saves: the data files' compression ("": the trainers')
  bool overwrite = false;      // storage saves: may replace a committed checkpoint at the path
};

std::string Description(const char* verb) {
  return absl::StrCat(
      "Asks the trainers of a running job to ", verb,
      " the checkpoint at their next Poll, waits until the operation ends (for a save: until\n"
      "it is committed, i.e. durable), showing progress, and prints a summary. Exits 1 with\n"
      "the coordinator's diagnosis when it is aborted. A relative path is taken from this\n"
      "shell's working directory.\n");
}

std::vector<FlagSpec> OperationFlags(pb::OperationKind kind) {
  std::vector<FlagSpec> flags = {
      {"coordinator", "HOST:PORT", "the coordinator, required"},
      {"job", "NAME", "the running job, required"},
      {"timeout", "DURATION", "give up waiting after this long (default 1h; the operation goes on)",
       "timeout_s"},
      {"arrival-deadline", "DURATION",
       "how long the trainers have to join (default: the coordinator's)", "arrival_deadline_s"},
      {"process-groups", "SPEC",
       "process groups to save/load within: per-node, read-groups:K, model-replica:K,\n"
       "data-parallel:K or explicit lists 0,1;2,3 (default: the trainers')"},
  };
  if (kind == pb::OPERATION_SAVE) {
    flags.push_back({"compression", "SPEC",
                     "storage saves: write the data files losslessly compressed: none, zstd\n"
                     "or zstd:LEVEL (default: the trainers', else none; docs/layout.md)"});
    flags.push_back({"overwrite", "",
                     "storage saves: replace a committed ckpt checkpoint at the path atomically\n"
                     "(anything else there is still refused)"});
    flags.push_back({"persist-to", "PATH",
                     "memory saves (mem://NAME): once durable in memory, persist it in the\n"
                     "background to this storage path as an ordinary committed checkpoint\n"
                     "(`ckptctl status` shows persisting / persisted / failed)"});
    flags.push_back({"persist-overwrite", "", "--persist-to may replace a committed checkpoint"});
    flags.push_back({"replicas", "N",
                     "memory saves (mem://NAME): extra copies of each data file, each on a\n"
                     "worker of another host (default: the trainers', else the coordinator's)"});
  }
  if (kind == pb::OPERATION_LOAD) {
    flags.push_back({"algorithm", "NAME",
                     "how workers move what one of them read to the others: broadcast,\n"
                     "overlap_all_to_all, gather_rounds, gather_object, or direct (each\n"
                     "reads what it needs; default: the coordinator's)"});
    flags.push_back({"memory-budget", "SIZE",
                     "bytes in flight per rank and wave (default: the coordinator's)",
                     "memory_budget_bytes"});
  }
  return With(flags, TlsFlagSpecs());
}

// The request from the command line: nullopt to go on, else the exit code after printing the
// help or a usage error.
std::optional<int> ParseOperation(const CommandSpec& spec, const std::vector<std::string>& args,
                                  OperationArgs* out) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(spec, args, &a)) return code;
  if (!a.Has("coordinator") || !a.Has("job") || a.positional.size() != 1) {
    return Usage(out->name, "--coordinator, --job and one checkpoint path are required");
  }
  out->coordinator = a.Get("coordinator");
  out->job = a.Get("job");
  out->path = a.positional[0];
  out->tls = TlsFromArgs(a);
  absl::Status s = DurationFlag(a, "timeout", &out->timeout);
  if (s.ok()) s = DurationFlag(a, "arrival-deadline", &out->arrival_deadline);
  if (s.ok()) s = SizeFlag(a, "memory-budget", 1, &out->memory_budget);
  if (!s.ok()) return Usage(out->name, std::string(s.message()));
  absl::StatusOr<pb::LoadAlgorithm> algorithm = ParseLoadAlgorithm(a.Get("algorithm"));
  if (!algorithm.ok()) {
    return Usage(out->name, absl::StrCat("--algorithm: ", algorithm.status().message()));
  }
  out->algorithm = *algorithm;
  out->persist_to = a.Get("persist-to");
  out->persist_overwrite = a.Has("persist-overwrite");
  out->overwrite = a.Has("overwrite");
  if (a.Has("replicas")) {
    int replicas = -1;
    if (!absl::SimpleAtoi(a.Get("replicas"), &replicas) || replicas < 0) {
      return Usage(out->name,
                   absl::StrCat("--replicas must be a count >= 0, got '", a.Get("replicas"), "'"));
    }
    out->memory_replicas = replicas;
  }
  out->persist_to = AbsoluteLocation(out->persist_to);  // s3:// and mem:// go as they are
  out->process_groups = a.Get("process-groups");
  out->compression = a.Get("compression");
  if (absl::StatusOr<CompressionOptions> c = ParseCompression(out->compression); !c.ok()) {
    return Usage(out->name, absl::StrCat("--compression: ", c.status().message()));
  }
  // The coordinator accepts only absolute paths (under its checkpoint roots): a relative one
  // means this shell's working directory. A memory checkpoint's path (mem://<name>), a
  // transfer's (xfer://<name>) and an object store's URL (s3://bucket/key) go as they are.
  out->path = AbsoluteLocation(out->path);
  return std::nullopt;
}

double Gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

// Asks the coordinator for the operation; its id, or the RPC's error.
absl::StatusOr<std::string> RequestOperation(pb::Coordinator::Stub* stub, const OperationArgs& op) {
  pb::RequestOperationRequest request;
  request.set_job(op.job);
  request.set_kind(op.kind);
  request.set_path(op.path);
  request.set_arrival_deadline_ms(absl::ToInt64Milliseconds(op.arrival_deadline));
  request.set_load_algorithm(op.algorithm);
  request.set_load_memory_budget_bytes(op.memory_budget);
  request.set_persist_to(op.persist_to);  // the coordinator refuses it unless a memory save
  request.set_persist_overwrite(op.persist_overwrite);
  request.set_process_groups(op.process_groups);
  request.set_compression(op.compression);
  request.set_overwrite(op.overwrite);  // refused by the coordinator unless a storage save
  if (op.memory_replicas >= 0) request.set_memory_replicas(op.memory_replicas);
  pb::RequestOperationResponse requested;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  CKPT_RETURN_IF_ERROR(
      FromGrpcStatus(stub->RequestOperation(&context, request, &requested),
                     absl::StrCat("RequestOperation at coordinator ", op.coordinator)));
  return requested.operation_id();
}

// Waits for the operation, printing each new phase line, and prints its summary.
int WaitAndReport(pb::Coordinator::Stub* stub, const OperationArgs& args, const std::string& id,
                  absl::Time start) {
  const char* name = args.name;
  std::string last_line;
  absl::StatusOr<pb::OperationStatus> waited = WaitForOperation(
      stub, args.coordinator, id, start + args.timeout, absl::Seconds(1),
      [&](const pb::OperationStatus& op) {
        std::string line = op.phase() == pb::PHASE_GATHERING
                               ? absl::StrCat("gathering: ", op.joined_ranks(), "/",
                                              op.world_size(), " ranks joined")
                               : absl::StrCat(pb::OperationPhase_Name(op.phase()).substr(6), ": ",
                                              absl::StrFormat("%.3f", Gb(op.bytes_done())), " / ",
                                              absl::StrFormat("%.3f", Gb(op.bytes_total())), " GB");
        if (line != last_line) std::fprintf(stderr, "  %s\n", line.c_str());
        last_line = line;
      });
  if (!waited.ok()) {
    std::fprintf(stderr, "\nckptctl %s: %s\n", name, waited.status().ToString().c_str());
    return 1;
  }
  const pb::OperationStatus& op = *waited;
  if (!IsFinal(op.phase())) {
    std::fprintf(stderr, "ckptctl %s: %s is still %s after %s (it goes on)\n", name,
                 op.id().c_str(), last_line.c_str(), absl::FormatDuration(args.timeout).c_str());
    return 1;
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (op.phase() == pb::PHASE_ABORTED) {
    std::fprintf(stderr, "ckptctl %s: %s\n", name, op.status().message().c_str());
    return 1;
  }
  std::printf("%s %s: job %s, %d ranks, %lld bytes in %.2f s (%.2f GB/s)%s\n", op.id().c_str(),
              name, args.job.c_str(), op.world_size(), static_cast<long long>(op.bytes_total()),
              seconds, seconds > 0 ? Gb(op.bytes_total()) / seconds : 0.0,
              args.kind == pb::OPERATION_SAVE
                  ? absl::StrCat(", committed at ", args.path).c_str()
                  : absl::StrCat(", ", op.bytes_read(), " bytes read from storage").c_str());
  return 0;
}

int Run(const std::vector<std::string>& args, const CommandSpec& spec, pb::OperationKind kind) {
  OperationArgs op;
  op.kind = kind;
  op.name = kind == pb::OPERATION_SAVE ? "save" : "load";
  if (std::optional<int> code = ParseOperation(spec, args, &op)) return *code;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      DialCoordinator(op.coordinator, op.tls, op.name);
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = pb::Coordinator::NewStub(*channel);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> id = RequestOperation(stub.get(), op);
  if (!id.ok()) {
    std::fprintf(stderr, "ckptctl %s: %s\n", op.name, id.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s requested as %s; waiting for the trainers of job %s\n", op.name,
               id->c_str(), op.job.c_str());
  return WaitAndReport(stub.get(), op, *id, start);
}

}  // namespace

const CommandSpec& SaveSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "save", "usage: ckptctl save --coordinator HOST:PORT --job NAME [flags] <checkpoint>",
      Description("save"), OperationFlags(pb::OPERATION_SAVE)};
  return *spec;
}

const CommandSpec& LoadSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "load", "usage: ckptctl load --coordinator HOST:PORT --job NAME [flags] <checkpoint>",
      Description("load"), OperationFlags(pb::OPERATION_LOAD)};
  return *spec;
}

int RunSaveCommand(const std::vector<std::string>& args) {
  return Run(args, SaveSpec(), pb::OPERATION_SAVE);
}
int RunLoadCommand(const std::vector<std::string>& args) {
  return Run(args, LoadSpec(), pb::OPERATION_LOAD);
}

}  // namespace ckpt::ckptctl
