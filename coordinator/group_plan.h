// The coordinator's side of process groups (planner/process_groups.h): checking a job's
// declared spec when ranks join or an operator requests an operation, resolving it for an
// operation (per-node from the hosts of the ranks' workers), and choosing the groups an
// exchange-based load reads and exchanges within, including the `auto` load's per-node groups
// across hosts. Pure: no gRPC, threads or logging.
#ifndef CKPT_COORDINATOR_GROUP_PLAN_H_
#define CKPT_COORDINATOR_GROUP_PLAN_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "planner/process_groups.h"

namespace ckpt::coordinator {

// Checks a spec as a join or request carries it: it parses, and every shape but per-node
// (whose hosts are known only once every rank joined) and the job's one group (valid for any
// size, and checked in O(1): every join checks it) resolves for `world_size` ranks.
// InvalidArgument prefixed with `who` (e.g. "job gpt rank 3") naming the rank or group.
absl::Status CheckProcessGroupSpec(const std::string& spec, int world_size, const std::string& who);

// Whether `op` declares groups other than one group of every rank.
bool DeclaresProcessGroups(const Operation& op);

// `op`'s groups: its spec resolved over its ranks (per-node from each rank's worker host).
// Errors name the operation.
absl::StatusOr<ProcessGroups> OperationGroups(const Operation& op);

// The groups an exchange-based load of `op` runs in, and why (for the plan's transport_reason).
struct LoadGroupChoice {
  ProcessGroups groups;
  std::string reason;  // "" for one group of every rank chosen by default
};

// Declared groups win. Otherwise, when `auto_load` (the load's algorithm was `auto`) and the
// ranks' workers are on several hosts, one group per node: each node reads what its ranks need
// from storage and exchanges over its own loopback, never across hosts. Else one group.
absl::StatusOr<LoadGroupChoice> ChooseLoadGroups(const Operation& op, bool auto_load);

// What a save plan depends on besides the ranks' descriptions: the declared spec and, for
// per-node groups, every rank's host (coordinator/save_plan_reuse keys on it).
std::string SaveGroupsKey(const Operation& op);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_GROUP_PLAN_H_
