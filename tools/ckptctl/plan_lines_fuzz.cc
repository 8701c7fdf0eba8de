// Fuzz target for the JSON Lines input of `ckptctl plan` (tools/ckptctl/plan_lines.h): the
// first byte picks the mode (distribute or main-replicas, Megatron's out-of-range holders
// kept or refused), the rest is the input text. Every input must get output lines or one
// error naming a line; no crash, no exception, no unbounded allocation. For distribute, every
// output line must assign each listed shard once to one of its holders in [0, num_ranks), and
// each line must give what the DOM path alone gives (distribute's fast path against its twin;
// plan_seconds aside).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tools/ckptctl/plan_lines.h"

namespace {

[[noreturn]] void Fail(const std::string& what, absl::string_view input) {
  std::fprintf(stderr, "plan_lines_fuzz: %s\ninput: %.*s\n", what.c_str(),
               static_cast<int>(std::min<size_t>(input.size(), 2000)), input.data());
  std::abort();
}

// One distribute output line against its input line: each input shard assigned exactly once,
// to a rank in [0, num_ranks) that holds it.
void CheckAssignment(const nlohmann::json& in, const nlohmann::json& out, absl::string_view input) {
  const int64_t num_ranks = in["num_ranks"].get<double>();
  const nlohmann::json& assignment = out["assignment"];
  if (assignment.size() != in["shard_to_ranks"].size()) Fail("not every shard assigned", input);
  for (const nlohmann::json& pair : assignment) {
    const int64_t rank = pair[1].get<int64_t>();
    if (rank < 0 || rank >= num_ranks) Fail("assigned rank out of range", input);
    bool holder = false;
    for (const nlohmann::json& entry : in["shard_to_ranks"]) {
      if (entry[0] != pair[0]) continue;
      for (const nlohmann::json& r : entry[1]) holder = holder || r.get<double>() == rank;
    }
    if (!holder) Fail("shard assigned to a rank that does not hold it", input);
  }
}

// The output line or error with plan_seconds cut off.
std::string Masked(const absl::StatusOr<std::string>& result) {
  if (!result.ok()) return result.status().ToString();
  return result->substr(0, result->rfind("\"plan_seconds\":"));
}

// Every line through RunPlanLine (fast path first) and through the DOM path alone.
void CheckAgainstDomPath(ckpt::ckptctl::PlanMode mode, absl::string_view text,
                         const ckpt::ckptctl::PlanOptions& options) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (Masked(ckpt::ckptctl::RunPlanLine(mode, line, options)) !=
        Masked(ckpt::ckptctl::RunPlanLineViaDom(mode, line, options))) {
      Fail("the fast path and the DOM path disagree", line);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using ckpt::ckptctl::PlanMode;
  const PlanMode mode = data[0] & 1 ? PlanMode::kMainReplicas : PlanMode::kDistribute;
  ckpt::ckptctl::PlanOptions options;
  options.keep_out_of_range_ranks = (data[0] & 2) != 0;
  const absl::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<std::string> out = ckpt::ckptctl::RunPlanLines(mode, text, options);
  CheckAgainstDomPath(mode, text, options);
  if (!out.ok()) {
    if (!absl::StartsWith(out.status().message(), "line ")) Fail("error names no line", text);
    return 0;
  }
  // A single-line distribute problem: check the assignment itself.
  if (mode != PlanMode::kDistribute || out->empty() || text.find('\n') != absl::string_view::npos) {
    return 0;
  }
  const nlohmann::json in = nlohmann::json::parse(text, nullptr, false);
  const nlohmann::json result = nlohmann::json::parse(*out, nullptr, false);
  if (in.is_discarded() || result.is_discarded() || !result.contains("assignment")) {
    Fail("output is not one result line", text);
  }
  CheckAssignment(in, result, text);  // out-of-range holders, when kept, are never chosen
  return 0;
}
