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
#include "sharding/layout.h"

namespace ckpt::coordinator {

// Every rank's gathered shards as TensorPieces, in (rank, local index) order; `local_index`
// receives each piece's index within its rank's shards. InvalidArgument naming the rank and
// key for an unknown dtype.
absl::StatusOr<std::vector<TensorPiece>> GatheredPieces(const Operation& op,
                                                        std::vector<int>* local_index);

// The save plan of a gathering-complete operation (BuildSavePlan over every rank's pieces):
// one pb::SavePlanPart per rank, serialized, with the bytes that rank writes. Layout errors
// (overlapping or missing main replicas, disagreeing dtypes/shapes) come back as
// InvalidArgument naming the tensor, ranks and regions.
// `staging_dir` is where the workers write their data files (SavePlanPart.staging_dir).
absl::StatusOr<std::vector<RankPlan>> PlanSave(const Operation& op,
                                               const SavePlanOptions& options = {},
                                               const std::string& staging_dir = "");

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPERATION_PLANNERS_H_
