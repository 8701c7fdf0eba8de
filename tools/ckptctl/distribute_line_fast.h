// The fast path of `ckptctl plan distribute`: one input line of the usual shape parsed
// straight into the planner's DistributionInput (one streaming pass, no JSON DOM), and the
// result line written into one preallocated buffer. Pure (no I/O, no logging, no threads).
//
// The parser is conservative: it accepts only a strict subset of what the DOM path
// (tools/ckptctl/plan_lines.cc, bounded by common/json_guard) accepts, and for that subset it
// builds exactly the input the DOM path builds. Anything else (a float or exponent, a string
// with an escape or a non-ASCII byte, an unknown or repeated field, fields out of order, any
// syntax or semantic error, a line over 256 MiB) makes it answer nullopt, and the caller runs
// the DOM path, which gives the result or the error with its field path. So this file never
// words an error itself and can never accept a line the DOM path refuses.
#ifndef CKPT_TOOLS_CKPTCTL_DISTRIBUTE_LINE_FAST_H_
#define CKPT_TOOLS_CKPTCTL_DISTRIBUTE_LINE_FAST_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/distribute.h"

namespace ckpt::ckptctl {

// Parses `line` = {"num_ranks": N, "shard_to_ranks": [...], "shard_to_size": [...],
// "cross_group": [...]} (num_ranks anywhere; shard_to_ranks before shard_to_size and
// cross_group; cross_group optional; JSON whitespace anywhere) into a DistributionInput that
// passed every check of the DOM path but one: ranks in [0, N) unless
// `keep_out_of_range_ranks`, no shard repeated in shard_to_size, every shard sized. A shard
// repeated in shard_to_ranks is left to DistributeShardsToRanks, which refuses it: when it
// refuses the input, the caller runs the DOM path for its error. nullopt: not handled here
// (see above), run the DOM path.
std::optional<DistributionInput> ParseDistributeLineFast(absl::string_view line,
                                                         bool keep_out_of_range_ranks);

// Every shard's id as the output line writes it, in shard order: shard i is
// text[ends[i], ends[i + 1]). Depends on the input alone, so it can be written while the
// distribution runs.
struct FormattedShardIds {
  std::string text;
  std::vector<size_t> ends;
};
FormattedShardIds FormatShardIds(const DistributionInput& input);

// The output line {"assignment": [[id, rank], ...], "plan_seconds": s}, byte for byte what
// nlohmann's dump() of the same object writes (no spaces; strings escaped as it escapes them),
// from the ids FormatShardIds wrote for the same input.
std::string FormatDistributeResult(const FormattedShardIds& ids,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds);

// The same in one call.
std::string FormatDistributeResult(const DistributionInput& input,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DISTRIBUTE_LINE_FAST_H_
