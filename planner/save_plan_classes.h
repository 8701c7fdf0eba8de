// The save plan over layout classes (planner/rank_pieces.h): the same plan BuildSavePlan makes
// from every rank's pieces flattened, from each rank's shared piece list and own column, with
// work and memory proportional to the distinct pieces plus one small record per (rank, piece)
// reference: no TensorPiece per reference is kept (a tensor's pieces are built for its layout
// check and dropped before the next tensor's).
//
// Pure: no gRPC, threads or logging.
#ifndef CKPT_PLANNER_SAVE_PLAN_CLASSES_H_
#define CKPT_PLANNER_SAVE_PLAN_CLASSES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/rank_pieces.h"
#include "planner/save_plan.h"

namespace ckpt {

// BuildSavePlan over `ranks[r]` = rank r's pieces (ranks.size() <= num_ranks; ranks past the
// span hold nothing). Equal to BuildSavePlan on the pieces flattened in (rank, local index)
// order, except that PlannedPiece::source_index is the piece's index in its writer's own list
// (the local index), not an index into the flattened pieces. Errors as BuildSavePlan's (same
// checks, naming the same tensor, ranks and regions), preceded by the conversion errors of a
// piece whose dtype or region cannot be read ("rank R tensor K: ...", the lowest such rank and
// piece).
absl::StatusOr<SavePlan> BuildSavePlanFromClasses(absl::Span<const RankPieces* const> ranks,
                                                  int64_t num_ranks,
                                                  const SavePlanOptions& options = {});

// Rank r's piece i as the flat planner sees it (TensorPiece of rank r); InvalidArgument
// "rank R tensor K: ..." when its dtype or region cannot be read.
absl::StatusOr<TensorPiece> TensorPieceOf(const RankPieces& pieces, int64_t rank, int i);

}  // namespace ckpt

#endif  // CKPT_PLANNER_SAVE_PLAN_CLASSES_H_
