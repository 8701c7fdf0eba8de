// `ckptctl plan distribute` and `ckptctl plan main-replicas`: the planner's Megatron-exact
// distributions (and DTensor local shards) over JSON Lines, for operators debugging a plan and
// for tests.
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/dtensor_lines.h"
#include "tools/ckptctl/plan_io.h"
#include "tools/ckptctl/plan_lines.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kSynopsis[] =
    "usage: ckptctl plan distribute    [--input F] [--output F] [--keep-out-of-range-ranks]\n"
    "       ckptctl plan main-replicas [--input F] [--output F] [--groups SPEC]\n"
    "       ckptctl plan dtensor       [--input F] [--output F]";

constexpr char kDescription[] =
    "Runs the planner's Megatron-exact distributions on JSON Lines: one JSON object per input\n"
    "line gives one output line (blank lines are skipped). Input is stdin and output stdout\n"
    "unless --input / --output name files. A shard id is [key, [offsets...], null | [start,\n"
    "stop]]; numbers may be integers or floats with integral values; unknown fields are\n"
    "ignored, a key repeated in one object is an error. N is at most 1048576.\n"
    "\n"
    "distribute: {\"num_ranks\": N, \"shard_to_ranks\": [[id, [ranks...]], ...],\n"
    "             \"shard_to_size\": [[id, bytes], ...], \"cross_group\": [id, ...]}\n"
    "  -> {\"assignment\": [[id, rank], ...], \"plan_seconds\": s}  (visiting order)\n"
    "  cross_group may be omitted (empty). Every rank must be in [0, N); with\n"
    "  --keep-out-of-range-ranks others are kept as Megatron keeps them (counted in\n"
    "  len(holders), never chosen), to compare with megatron-core itself.\n"
    "main-replicas: {\"num_ranks\": N, \"ignore_groups\": bool,\n"
    "                \"per_rank\": [[[id, bytes, is_main], ...], ...]}\n"
    "  -> {\"distribution\": null} when N <= 1, else\n"
    "     {\"distribution\": {\"main_rank_for_shard\": [[id, rank], ...],\n"
    "      \"shards_in_this_group\": [id, ...], \"all_ranks_for_shard\": [[id, [ranks...]], "
    "...]},\n"
    "      \"plan_seconds\": s}\n"
    "  ignore_groups may be omitted (false); per_rank must have N lists (also for N <= 1).\n"
    "  With \"groups\" (or --groups for every line without one): a process-group spec "
    "(\"read-groups:K\", \"model-replica:K\",\n"
    "  \"data-parallel:K\", \"0,1;2,3\") or [[ranks...], ...] partitioning the N ranks:\n"
    "  -> {\"groups\": [{\"ranks\": [...], \"distribution\": null | {...}}, ...],\n"
    "      \"writers\": [[id, rank], ...], \"plan_seconds\": s}: each group's distribution\n"
    "  with that group as the parallelization group (group ranks index \"ranks\"), and, when\n"
    "  not ignore_groups, the save's writer of each main replica (global ranks).\n"
    "dtensor: {\"global_shape\": [..], \"mesh_shape\": [..],\n"
    "          \"placements\": [\"Shard(<dim>)\" | \"Replicate()\", ..], \"ranks\": [r, ..]}\n"
    "  -> {\"shards\": [[local_shape, global_offset, replica_id], ..]}  (one per listed rank,\n"
    "     or every rank in order when \"ranks\" is omitted), as PyTorch's DTensor computes\n"
    "     them (compute_local_shape_and_global_offset; an empty shard's offset is the dim's\n"
    "     global size); replica_id is the coordinates along the Replicate() mesh dims.\n"
    "\n"
    "plan_seconds times the distribution alone (not JSON parsing or printing).\n"
    "Errors: a malformed line or an input the planner rejects stops the command with one\n"
    "message naming the line number and field, exit status 1. Output is buffered and written\n"
    "only when every line succeeded (an --output file is replaced atomically), so a failed\n"
    "run writes nothing.\n";

int RunPlan(const std::vector<std::string>& args) {
  const std::string prog = "ckptctl plan";
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(PlanSpec(), args, &a)) return *code;
  if (a.positional.size() != 1) {
    return Usage("plan", "expected one mode: distribute, main-replicas or dtensor");
  }
  const std::string& mode = a.positional[0];
  if (mode != "distribute" && mode != "main-replicas" && mode != "dtensor") {
    return Usage("plan", absl::StrCat("unknown mode \"", mode, "\""));
  }
  const std::string name = prog + " " + mode;
  std::optional<std::string> input_path, output_path;
  if (a.Has("input")) input_path = a.Get("input");
  if (a.Has("output")) output_path = a.Get("output");
  PlanOptions options;
  options.keep_out_of_range_ranks = a.Has("keep-out-of-range-ranks");
  if (options.keep_out_of_range_ranks && mode != "distribute") {
    return Usage("plan", "--keep-out-of-range-ranks applies only to plan distribute");
  }
  options.groups = a.Get("groups");
  if (a.Has("groups") && mode != "main-replicas") {
    return Usage("plan", "--groups applies only to plan main-replicas");
  }

  absl::StatusOr<PlanInput> text = ReadPlanInput(input_path);
  if (!text.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(text.status().message()).c_str());
    return 1;
  }
  UseHugePagesForLargeArrays(text->view().size());
  absl::StatusOr<std::string> output =
      mode == "dtensor"
          ? RunDTensorLines(text->view())
          : RunPlanLines(mode == "distribute" ? PlanMode::kDistribute : PlanMode::kMainReplicas,
                         text->view(), options);
  if (!output.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(output.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = WritePlanOutput(output_path, *output); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

const CommandSpec& PlanSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "plan",
      kSynopsis,
      kDescription,
      {{"input", "FILE", "read the JSON Lines from FILE (default stdin)"},
       {"output", "FILE", "write the results to FILE, replaced atomically (default stdout)"},
       {"keep-out-of-range-ranks", "",
        "distribute: keep ranks outside [0, N) as Megatron does (counted in\n"
        "len(holders), never chosen)"},
       {"groups", "SPEC",
        "main-replicas: process groups (read-groups:K, model-replica:K,\n"
        "data-parallel:K, 0,1;2,3) for lines without a \"groups\" field"}}};
  return *spec;
}

// No library exception (std::bad_alloc, iostreams) ends the process: one line, exit 1.
int RunPlanCommand(const std::vector<std::string>& args) {
  try {
    return RunPlan(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptctl plan: %s\n", e.what());
    return 1;
  }
}

}  // namespace ckpt::ckptctl
