// The fast path of `ckptctl plan distribute`: one input line of the usual shape parsed
// straight into the planner's CompactDistributionInput (one streaming pass, no JSON DOM, no
// allocation per shard), and the result line written into one preallocated buffer. Pure (no
// I/O, no logging, no threads).
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

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/distribute.h"

namespace ckpt::ckptctl {

// Every shard's id as the output line writes it, in shard order: shard i is
// text()[ends[i], ends[i + 1]).
struct FormattedShardIds {
  std::unique_ptr<char[]> buffer;  // not zero-filled: only the bytes written are touched
  size_t size = 0;
  std::vector<size_t> ends = {0};

  absl::string_view text() const { return absl::string_view(buffer.get(), size); }
};

// One distribute line read by the fast path: the planner's input (its keys view the line,
// which must outlive it) and each shard's id as the output writes it.
struct FastDistributeLine {
  CompactDistributionInput input;
  FormattedShardIds ids;
};

// Parses `line` = {"num_ranks": N, "shard_to_ranks": [...], "shard_to_size": [...],
// "cross_group": [...]} (num_ranks anywhere; shard_to_ranks before shard_to_size and
// cross_group; cross_group optional; JSON whitespace anywhere) into an input that passed
// every check of the DOM path but one: ranks in [0, N) unless `keep_out_of_range_ranks`
// (others are kept as -1), no shard repeated in shard_to_size, every shard sized. A shard
// repeated in shard_to_ranks (or a negative size) is left to DistributeShardsToRanks, which
// refuses it: when it refuses the input, the caller runs the DOM path for its error.
// nullopt: not handled here (see above), run the DOM path.
std::optional<FastDistributeLine> ParseDistributeLineFast(absl::string_view line,
                                                          bool keep_out_of_range_ranks);

// Every shard's id of a DistributionInput as the output line writes it (the DOM path's ids).
FormattedShardIds FormatShardIds(const DistributionInput& input);

// The output line {"assignment": [[id, rank], ...], "plan_seconds": s}, byte for byte what
// nlohmann's dump() of the same object writes (no spaces; strings escaped as it escapes them),
// from the ids written for the same input. Its capacity leaves room for one more byte (the
// line's '\n').
std::string FormatDistributeResult(const FormattedShardIds& ids,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds);

// The same in one call.
std::string FormatDistributeResult(const DistributionInput& input,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DISTRIBUTE_LINE_FAST_H_
