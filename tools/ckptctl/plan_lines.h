// The JSON Lines of `ckptctl plan` (see `ckptctl plan --help`): each non-blank input line is
// one problem for the planner's Megatron-exact distributions and gives one output line. Pure
// (no I/O) and exception-free at its boundary, so the CLI and the fuzz target share it.
#ifndef CKPT_TOOLS_CKPTCTL_PLAN_LINES_H_
#define CKPT_TOOLS_CKPTCTL_PLAN_LINES_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json_guard.h"
#include "planner/distribute.h"

namespace ckpt::ckptctl {

enum class PlanMode { kDistribute, kMainReplicas };

struct PlanOptions {
  // distribute: accept holder ranks outside [0, num_ranks) as Megatron does (they count in
  // len(holders) and are never chosen) instead of reporting them; for comparing with
  // megatron-core itself.
  bool keep_out_of_range_ranks = false;
  // main-replicas: the process groups (planner/process_groups.h spec text) of every line that
  // has no "groups" field of its own; "": none (one distribution over all ranks).
  std::string groups;
};

// What one input line may hold before its DOM is built: nesting 16, 4 GiB, 2^28 values,
// strings (shard keys) of 1 MiB.
JsonLimits PlanLineLimits();

// Runs one line (without its newline). Errors are InvalidArgument naming the field, e.g.
// "field shard_to_ranks[3][1][0]: rank 7 is outside [0, 4)".
absl::StatusOr<std::string> RunPlanLine(PlanMode mode, absl::string_view line,
                                        const PlanOptions& options = {});

// RunPlanLine without distribute's fast path (tools/ckptctl/distribute_line_fast.h): every
// line through json_guard and nlohmann's DOM. The reference the fast path is tested against.
absl::StatusOr<std::string> RunPlanLineViaDom(PlanMode mode, absl::string_view line,
                                              const PlanOptions& options = {});

// The DOM path's checked DistributionInput for one distribute line (or its field error).
absl::StatusOr<DistributionInput> ParseDistributeLineViaDom(absl::string_view line,
                                                            const PlanOptions& options = {});

// Runs every line of `text` ('\n'-separated; a trailing '\r' is dropped and blank lines are
// skipped) and returns the output lines, each ending in '\n'. The first failing line stops
// it with "line N: <error>".
absl::StatusOr<std::string> RunPlanLines(PlanMode mode, absl::string_view text,
                                         const PlanOptions& options = {});

// The JSON Lines driver both line formats share: runs `run_line` on every line of `text`
// ('\n'-separated; a trailing '\r' is dropped, blank lines skipped) and joins the outputs, each
// ending in '\n'; the first failing line stops it with "line N: <error>".
absl::StatusOr<std::string> RunEachLine(
    absl::string_view text,
    const std::function<absl::StatusOr<std::string>(absl::string_view line)>& run_line);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_PLAN_LINES_H_
