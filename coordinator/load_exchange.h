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
#include "coordinator/operation_kind.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// How loads are planned.
struct LoadPlannerOptions {
  // An exchange algorithm, LOAD_DIRECT or LOAD_AUTO (AutoLoadAlgorithm); UNSPECIFIED:
  // broadcast.
  pb::LoadAlgorithm algorithm = pb::LOAD_BROADCAST;
  // Bytes in flight per rank and wave (unit buffers + received bytes).
  int64_t memory_budget_bytes = int64_t{1} << 30;
  // The algorithm came from LOAD_AUTO: without declared process groups, ranks on several hosts
  // exchange within per-node groups (coordinator/group_plan.h ChooseLoadGroups).
  bool auto_chosen = false;
  // true: each part carries only its rank's share of its group's plan (coordinator/
  // plan_parts.h); false: every part carries its group's whole plan, the brute-force twin the
  // tests compare with (tests/plan_parts_property_test.cc, load_exchange_test.cc). No flag
  // sets it: the daemon always sends own shares.
  bool own_shares = true;
};

// LOAD_AUTO: direct when every rank of the operation is served on one host, else broadcast
// within per-node groups (unless the job declares its own process groups).
// On one host the ranks share one storage device and the exchange moves over loopback what
// each could read itself: measured ~2x slower than direct reads (docs/BENCHMARKS.md, "Loads").
// Across hosts, reading each shared byte once and exchanging it saves storage bandwidth.
pb::LoadAlgorithm AutoLoadAlgorithm(const Operation& op);

// Over which transport the workers of an exchange-based load exchange, and why.
struct ExchangeTransport {
  bool device = false;  // true: NCCL on the device; false: Gloo from host staging
  std::string reason;   // e.g. "rank 1 has host tensors"
};

// The transport of `op`'s exchange: the device (NCCL) when every shard of every rank lives in
// device memory (as the ranks said when they joined; at least one shard), every rank's worker
// can create an NCCL communicator, and no two ranks share a GPU (NCCL refuses two ranks on
// one device); otherwise host staging over Gloo, with the first reason found. Pure.
ExchangeTransport ChooseExchangeTransport(const Operation& op);

// Validates the operation against the checkpoint at op.path like PlanDirectLoad, streaming its
// manifest (StreamLoad: never held whole; the planner keeps only the pieces some read
// overlaps, as StoredPieceInfo), then plans the exchange-based load: one serialized
// pb::LoadPlanPart per rank carrying its own share of the plan (its requests, the units it
// reads or receives plus the collective schedule its algorithm needs, its deliveries:
// coordinator/plan_parts.h), its manifest_share (the pieces of the units it reads in full, the
// pieces of its other units by tensor and region; its units index the share), the algorithm,
// the budget, the rendezvous group
// "load/<operation id>" and the transport (ChooseExchangeTransport).
// With several process groups (declared, or auto's per-node groups; coordinator/group_plan.h)
// each group is planned on its own, as Megatron's ignore_groups load: a part carries its
// group's plan only (ranks numbered within the group, LoadPlanPart.group_rank), the group
// reads from storage every piece its ranks need (pieces whose main replica is in another group,
// cross-group, chosen last), exchanges only among its ranks, and its rendezvous group is
// "load/<operation id>/g<index>": one communicator per group, never one over the job.
// InvalidArgument for an unknown algorithm.
absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoad(const Operation& op,
                                                       const LoadPlannerOptions& options);

// The exchange-based plan against `manifest` (validated by the caller, held whole; parts carry
// no manifest_share and their units index `manifest`) instead of the checkpoint at op.path, with
// options.algorithm an exchange algorithm (not direct or auto) and, when not empty, the ranks
// allowed to read each stored piece (one list per piece of `manifest`; planner
// LoadPlanOptions::readers_of_piece). Used for memory checkpoints.
absl::StatusOr<std::vector<RankPlan>> PlanExchangeLoadFrom(
    const Operation& op, const LoadPlannerOptions& options, const pb::Manifest& manifest,
    std::vector<std::vector<int64_t>> readers_of_piece);

// The load kind: plans with PlanExchangeLoad, the operation's own algorithm and budget (from
// the trainers or the operator) over `defaults`. A load writes nothing, so there is nothing to
// commit or clean up.
class ExchangeLoadKind final : public OperationKindHandler {
 public:
  explicit ExchangeLoadKind(LoadPlannerOptions defaults) : defaults_(defaults) {}

  absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) override;
  // Loads never reach the committing phase; FailedPrecondition if asked.
  absl::Status Commit(Operation& op) override;
  absl::Status Finalize(const Operation&) override { return absl::OkStatus(); }

  // The options a load of `op` is planned with: defaults_, overridden by op's own.
  LoadPlannerOptions OptionsFor(const Operation& op) const;

 private:
  LoadPlannerOptions defaults_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_LOAD_EXCHANGE_H_
