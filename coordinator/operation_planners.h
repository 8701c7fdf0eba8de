// Adapters from the coordinator's operations to the pure planners: gathered shard metadata
// (pb::PieceMeta per rank) in, one serialized plan part per rank out. Pure: no gRPC, threads
// or logging.
#ifndef CKPT_COORDINATOR_OPERATION_PLANNERS_H_
#define CKPT_COORDINATOR_OPERATION_PLANNERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "planner/save_plan.h"
#include "planner/save_plan_classes.h"
#include "sharding/layout.h"

namespace ckpt::coordinator {

// The save plan of a gathering-complete operation (BuildSavePlanFromClasses over every rank's
// shards, the plan BuildSavePlan makes of them flattened, without flattening them): one
// pb::SavePlanPart per rank, serialized, with the bytes that rank writes. InvalidArgument
// naming the rank and key for a piece whose dtype or region cannot be read. Layout errors
// (overlapping or missing main replicas, disagreeing dtypes/shapes) come back as
// InvalidArgument naming the tensor, ranks and regions.
// `staging_dir` is where the workers write their data files (SavePlanPart.staging_dir).
absl::StatusOr<std::vector<RankPlan>> PlanSave(const Operation& op,
                                               const SavePlanOptions& options = {},
                                               const std::string& staging_dir = "");

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPERATION_PLANNERS_H_
