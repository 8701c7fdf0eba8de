// The JSON Lines of `ckptctl plan dtensor` (see `ckptctl plan --help`): each non-blank input
// line is one DTensor layout (global shape, device mesh, placements) and gives one output line
// with every rank's local shape, global offset and replica id as sharding/dtensor.h computes
// them. Pure (no I/O) and exception-free at its boundary; used to compare ckpt with PyTorch's
// own compute_local_shape_and_global_offset (tests/dtensor_oracle_test.py).
#ifndef CKPT_TOOLS_CKPTCTL_DTENSOR_LINES_H_
#define CKPT_TOOLS_CKPTCTL_DTENSOR_LINES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::ckptctl {

// Runs one line (without its newline):
//   {"global_shape": [..], "mesh_shape": [..], "placements": ["Shard(0)", "Replicate()", ..],
//    "ranks": [r, ..]}                                   ("ranks" optional: every rank)
//   -> {"shards": [[local_shape, global_offset, replica_id], ..]}   (one per rank, in order)
// Errors are InvalidArgument naming the field, e.g. "field placements[1]: expected
// \"Shard(<dim>)\" or \"Replicate()\", got \"S0\"".
absl::StatusOr<std::string> RunDTensorLine(absl::string_view line);

// Runs every line of `text` as RunPlanLines does ("line N: <error>" on the first failure).
absl::StatusOr<std::string> RunDTensorLines(absl::string_view text);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DTENSOR_LINES_H_
