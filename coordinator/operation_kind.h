// One kind of operation (save, load, reshard) as the coordinator drives it: Plan when every
// rank arrived, Commit when every rank reported success, Finalize once the operation ended
// (done or aborted). CoordinatorService holds one registration per kind (RegisterKind) and
// calls these from its phase machine; no other code dispatches on the kind.
#ifndef CKPT_COORDINATOR_OPERATION_KIND_H_
#define CKPT_COORDINATOR_OPERATION_KIND_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_state.h"

namespace ckpt::coordinator {

// The plan/commit/finalize steps of one operation kind. Implementations are thread-safe: the
// service calls Plan and Commit without its lock, for several operations at once.
class OperationKindHandler {
 public:
  virtual ~OperationKindHandler() = default;

  // One plan part per rank for an operation in the planning phase (every rank's shard metadata
  // is in op.ranks[r].shards). Errors abort the operation for every rank.
  virtual absl::StatusOr<std::vector<RankPlan>> Plan(const Operation& op) = 0;
  // What planning needs from storage before any rank's data is read (a save's staging
  // directory), called without the service's lock, on the operation without its ranks
  // (JobState::CopyWithoutRanks), before ReusedPlan and Plan. A kind whose Plan is called
  // without it does the same work there. Errors abort the operation as Plan's do.
  virtual absl::Status Prepare(const Operation& /*op*/) { return absl::OkStatus(); }
  // Called under the service's lock after Prepare, on the operation itself (no lent copy): the
  // plan when it is a copy of one kept for the same layout (a repeat save of unchanged ranks,
  // issue 16), made without touching storage in O(ranks) comparisons; nullopt when the
  // operation must be planned with Plan.
  virtual std::optional<std::vector<RankPlan>> ReusedPlan(const Operation& /*op*/) {
    return std::nullopt;
  }
  // Makes the result durable once every rank reported success (saves and reshards write the
  // manifest); an error aborts the operation with it. `op` is the service's lent copy
  // (JobState::LendGathered): a kind may consume its bulky per-rank data (e.g. free each
  // rank's written record once merged); nothing reads that data after the commit.
  virtual absl::Status Commit(Operation& op) = 0;
  // Called once when the operation reached done or aborted, under the service's lock (keep it
  // short): removes what an aborted operation left behind. Errors are logged by the caller.
  virtual absl::Status Finalize(const Operation& op) = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPERATION_KIND_H_
