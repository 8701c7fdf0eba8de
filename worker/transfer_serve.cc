#include "worker/transfer_serve.h"

#include <string>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "worker/load_exchange_executor.h"

namespace ckpt::worker {

// Weak: the testonly worker/test_hooks_on.cc replaces it (see transfer_serve.h).
ABSL_ATTRIBUTE_WEAK void HoldServingForTest(const MemoryGate& /*gate*/,
                                            const absl::Notification* /*stopping*/) {}

PartOutcome TransferServeExecutor::Execute(const PartRun& run) {
  const absl::Time start = absl::Now();
  const pb::WorkItem& item = run.item;
  PartOutcome out;
  pb::LoadPlanPart part;
  if (!part.ParseFromString(item.plan_part()) || part.rank() != item.rank() ||
      part.rank() < part.transfer_destination_ranks()) {
    out.status = absl::InvalidArgumentError(
        absl::StrCat("unreadable serving part of rank ", item.rank(), " of ", item.operation_id()));
    return out;
  }
  // A serving rank has no trainer: an empty session of its rank (no tensors, nothing scattered).
  SessionInfo session;
  session.id = absl::StrCat("serving/", item.operation_id());
  session.trainer.job = item.job();
  session.trainer.rank = part.rank();
  session.trainer.world_size = part.world_size();
  ExchangeLoadContext context;
  FillDataPlaneEndpoint(env_, &context);
  if (env_.memory_tier != nullptr) context.memory_tier = *env_.memory_tier;
  ExchangeLoadStats stats;
  const ProgressFn progress = [&run, this](int64_t bytes_done) {
    HoldServingForTest(run.gate, env_.stopping);
    run.progress(bytes_done);
  };
  out.status = ExecuteExchangeLoadPart(part, session, context, run.gate, &stats, progress);
  out.bytes_read = stats.bytes_read;
  if (!out.status.ok() && !run.gate.closed() && out.status.code() != absl::StatusCode::kDataLoss) {
    // A peer that failed shows up here as a broken connection: give the coordinator its lease
    // to abort with the root cause (a dead worker, a receiver's DataLoss) before this symptom.
    const absl::Time until = absl::Now() + env_.link->lease() + absl::Seconds(1);
    while (!run.gate.closed() && absl::Now() < until &&
           (env_.stopping == nullptr || !env_.stopping->HasBeenNotified())) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  if (!out.status.ok()) {
    out.status =
        absl::Status(out.status.code(), absl::StrCat("serving ", item.serving_source(), " as rank ",
                                                     part.rank(), ": ", out.status.message()));
  }
  spdlog::info(
      "transfer_served op={} rank={} source=\"{}\" version={} bytes_read={} bytes_sent={} "
      "rendezvous_s={:.3f} communicator_reused={} read_s={:.3f} exchange_s={:.3f} seconds={:.3f} "
      "ok={}",
      item.operation_id(), part.rank(), item.serving_source(), part.transfer_version(),
      stats.bytes_read, stats.bytes_sent, absl::ToDoubleSeconds(stats.rendezvous_time),
      stats.communicator_reused, absl::ToDoubleSeconds(stats.read_time),
      absl::ToDoubleSeconds(stats.exchange_time), absl::ToDoubleSeconds(absl::Now() - start),
      out.status.ok());
  return out;
}

}  // namespace ckpt::worker
