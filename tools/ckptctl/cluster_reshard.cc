#include "tools/ckptctl/cluster_reshard.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/store_url.h"
#include "nlohmann/json.hpp"
#include "planner/layout_spec.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/operation_phase.h"
#include "tools/ckptctl/operation_wait.h"

namespace ckpt::ckptctl {
namespace {

double Gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

int Fail(const std::string& message) {
  std::fprintf(stderr, "ckptctl reshard: %s\n", message.c_str());
  return 1;
}

// The coordinator accepts only absolute paths (under its checkpoint roots): a relative one
// means this shell's working directory; an s3:// URL goes as it is. Nothing else is rewritten
// (it judges "..").
std::string Absolute(const std::string& path) { return AbsoluteLocation(path); }

// The summary of a committed cluster reshard: one JSON object, or lines for people.
void PrintSummary(const pb::StartReshardRequest& request, const pb::StartReshardResponse& started,
                  const pb::OperationStatus& op, double seconds, bool json) {
  const double gbps = seconds > 0 ? Gb(op.bytes_total()) / seconds : 0;
  if (json) {
    nlohmann::json j = {{"operation", op.id()},
                        {"src", request.source()},
                        {"dst", request.destination()},
                        {"world_size", op.world_size()},
                        {"workers", started.workers()},
                        {"bytes_read", op.bytes_read()},
                        {"bytes_written", op.bytes_total()},
                        {"seconds", seconds},
                        {"gb_per_s", gbps}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "resharded %s -> %s on the cluster (%s: %d ranks on %d worker(s))\n"
      "  read %lld bytes, wrote %lld bytes in %.2f s, %.2f GB/s, committed\n",
      request.source().c_str(), request.destination().c_str(), op.id().c_str(), op.world_size(),
      started.workers(), static_cast<long long>(op.bytes_read()),
      static_cast<long long>(op.bytes_total()), seconds, gbps);
}

}  // namespace

int RunClusterReshard(const ClusterReshardArgs& args) {
  // Sent unparsed: the coordinator validates it (and must withstand whatever it holds).
  absl::StatusOr<std::string> layout = LayoutSpec::ReadFile(args.layout_path);
  if (!layout.ok()) return Fail(std::string(layout.status().message()));

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      DialCoordinator(args.coordinator, args.tls, "reshard");
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = pb::Coordinator::NewStub(*channel);
  const absl::Time start = absl::Now();
  pb::StartReshardRequest request;
  request.set_source(Absolute(args.source));
  request.set_destination(Absolute(args.destination));
  request.set_layout_json(*std::move(layout));
  request.set_overwrite(args.overwrite);
  request.set_memory_budget_bytes(args.memory_budget_bytes);
  request.set_max_workers(args.max_workers);
  pb::StartReshardResponse started;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    absl::Status s = FromGrpcStatus(stub->StartReshard(&context, request, &started),
                                    absl::StrCat("StartReshard at coordinator ", args.coordinator));
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  const bool show = !args.json && isatty(STDERR_FILENO);
  if (!args.json) {
    std::fprintf(stderr, "reshard started as %s: %d ranks on %d worker(s)\n",
                 started.operation_id().c_str(), started.world_size(), started.workers());
  }
  absl::StatusOr<pb::OperationStatus> waited =
      WaitForOperation(stub.get(), args.coordinator, started.operation_id(), start + args.timeout,
                       absl::Milliseconds(500), [&](const pb::OperationStatus& op) {
                         if (!show) return;
                         std::fprintf(stderr, "\r  %s: %.3f / %.3f GB  ",
                                      pb::OperationPhase_Name(op.phase()).substr(6).c_str(),
                                      Gb(op.bytes_done()), Gb(op.bytes_total()));
                       });
  if (!waited.ok()) {
    if (show) std::fputc('\n', stderr);
    return Fail(std::string(waited.status().message()));
  }
  const pb::OperationStatus& op = *waited;
  if (!IsFinal(op.phase())) {
    if (show) std::fputc('\n', stderr);
    return Fail(absl::StrCat(op.id(), " did not finish within ", absl::FormatDuration(args.timeout),
                             " (it goes on at the coordinator)"));
  }
  if (show) std::fputc('\n', stderr);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (op.phase() == pb::PHASE_ABORTED) return Fail(op.status().message());
  PrintSummary(request, started, op, seconds, args.json);
  return 0;
}

}  // namespace ckpt::ckptctl
