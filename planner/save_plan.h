// The save plan: from every rank's sharded-state metadata, who writes each distinct piece and
// into which data file, so that every element is written exactly once, write work is spread
// evenly over ranks (Megatron's main-replica distribution) and files are few and large.
#ifndef CKPT_PLANNER_SAVE_PLAN_H_
#define CKPT_PLANNER_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/process_groups.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/region.h"

namespace ckpt {

// Knobs of the file packing.
struct SavePlanOptions {
  // A writer opens another file only when each of its files would still hold at least this
  // much (so a writer with less than this writes exactly one file).
  int64_t target_file_bytes = int64_t{256} << 20;
  // Process groups (planner/process_groups.h) the writes are distributed within, each as
  // Megatron's parallelization group; empty: one group of every rank. Must partition the ranks.
  ProcessGroups groups;
  // BuildSavePlanFromClasses only: false leaves each planned piece's key, dtype, shape and
  // region empty (it carries size_bytes, source_index and id_order): the coordinator names
  // pieces by the writer's local index (pb::PlanPiece), and at 100k ranks copying them was
  // ~50 M allocations.
  bool describe_pieces = true;
};

// One piece to write: a main replica, written by a rank that holds identical data.
struct PlannedPiece {
  std::string key;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  Region region;
  int64_t size_bytes = 0;
  // Index (into the metadata given to BuildSavePlan) of the writer's own copy of this piece.
  int64_t source_index = 0;
  // The piece's place among its writer's pieces in shard id order, when the planner knows it
  // (-1: compare the ids). File packing orders by it.
  int64_t id_order = -1;
};

// One data file and the pieces it holds, in the order they are to be laid out.
struct PlannedFile {
  std::string path;  // relative to the checkpoint directory, e.g. "data/r3_0.safetensors"
  int64_t total_bytes = 0;
  std::vector<PlannedPiece> pieces;
};

// Everything one rank writes.
struct WriterPlan {
  int64_t rank = 0;
  int64_t total_bytes = 0;
  std::vector<PlannedFile> files;
};

// The whole save plan: writers in ascending rank order (ranks with nothing to write omitted).
struct SavePlan {
  int64_t num_ranks = 0;
  std::vector<WriterPlan> writers;
};

// Validates the layout (dtype/shape agreement, valid regions, main replicas covering every
// element exactly once; see sharding/layout.h), then picks each main replica's writer among
// the ranks holding the same (key, offsets, flat range) with the main-replica distribution
// (save mode over all `num_ranks` ranks), then packs each writer's pieces into
// max(1, min(floor(bytes / target), non-empty pieces)) files, largest piece first into the
// emptiest file (ties: lower file index), pieces inside a file ordered by shard id. Errors name
// the tensor, ranks and regions. Deterministic: equal metadata always gives the same plan.
absl::StatusOr<SavePlan> BuildSavePlan(absl::Span<const TensorPiece> pieces, int64_t num_ranks,
                                       const SavePlanOptions& options = {});

// OK, or InvalidArgument for a save plan's options that no layout can satisfy: `num_ranks` not
// positive, `target_file_bytes` not positive, or process groups that do not partition the ranks.
absl::Status ValidateSaveOptions(int64_t num_ranks, const SavePlanOptions& options);

// "data/r<rank>_<index>.safetensors".
std::string DataFileName(int64_t rank, int64_t index);

// The plan of writers whose pieces are `by_writer[rank]` (`num_ranks` entries), each writer's
// pieces packed into files as BuildSavePlan packs them (see there), writers in ascending rank
// order; used by the planner over layout classes too (planner/save_plan_classes.h).
SavePlan PackWriters(std::vector<std::vector<PlannedPiece>> by_writer, int64_t num_ranks,
                     int64_t target_file_bytes);

}  // namespace ckpt

#endif  // CKPT_PLANNER_SAVE_PLAN_H_
