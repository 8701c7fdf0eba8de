// The exchange-based load planner: each stored piece somebody needs is read from storage once,
// by one rank (Megatron's greedy distribution, planner/load_plan.h), and its bytes move to
// the other ranks that need them over the workers' communicator with the chosen exchange
// algorithm, in waves bounded by a per-rank memory budget. "direct" keeps the direct-read plan
// (every rank reads what it needs itself; a debugging aid). No gRPC, no logging.
#ifndef CKPT_COORDINATOR_LOAD_EXCHANGE_H_
#define CKPT_COORDINATOR_LOAD_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_state.h"

namespace ckpt::coordinator {

// How loads are planned.
struct LoadPlannerOptions {
  // "broadcast", "overlap_all_to_all", "gather_rounds", "gather_object", "direct" or "auto"
  // (AutoLoadAlgorithm).
  std::string algorithm = "broadcast";
  // Bytes in flight per rank and wave (unit buffers + received bytes).
  int64_t memory_budget_bytes = int64_t{1} << 30;
};

// Names accepted as LoadPlannerOptions::algorithm, default first.
const std::vector<std::string>& LoadAlgorithmNames();

// "auto": "direct" when every rank of the operation is served on one host, else "broadcast".
// On one host the ranks share one storage device and the exchange moves over loopback what
// each could read itself: measured ~2x slower than direct reads (docs/BENCHMARKS.md, "Loads").
// Across hosts, reading each shared byte once and exchanging it saves storage bandwidth.
std::string AutoLoadAlgorithm(const Operation& op);

// Validates the operation against the checkpoint at op.path like PlanDirectLoad, then plans
// the exchange-based load: one serialized pb::LoadPlanPart per rank carrying the whole plan
// (every rank's requests, the waves of read units and deliveries), the algorithm, the budget
// and the rendezvous group "load/<operation id>". InvalidArgument for an unknown algorithm.
absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoad(const Operation& op,
                                                       const LoadPlannerOptions& options);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_LOAD_EXCHANGE_H_
