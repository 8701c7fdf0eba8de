#include "tools/loadgen/coordinator_log.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ckpt::loadgen {
namespace {

// The number after " <name>=" in `line`; -1 when absent or not a number.
double FieldSeconds(absl::string_view line, absl::string_view name) {
  const std::string key = absl::StrCat(" ", name, "=");
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return -1;
  absl::string_view value = line.substr(at + key.size());
  value = value.substr(0, value.find(' '));
  double seconds = -1;
  return absl::SimpleAtod(value, &seconds) ? seconds : -1;
}

}  // namespace

std::map<std::string, OperationLogTimes> ParseCoordinatorLog(absl::string_view text) {
  std::map<std::string, OperationLogTimes> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // "<time> <level> coordinator <event> op=<id> ..."
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::MaxSplits(' ', 5));
    if (words.size() < 5 || words[2] != "coordinator") continue;
    absl::string_view op = words[4];
    if (!absl::ConsumePrefix(&op, "op=")) continue;
    absl::Time at;
    std::string error;
    if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", words[0], absl::UTCTimeZone(), &at, &error)) {
      continue;
    }
    OperationLogTimes& times = out[std::string(op)];
    const absl::string_view event = words[3];
    if (event == "operation_gathered") {
      times.gathered = at;
    } else if (event == "operation_planned") {
      times.planned = at;
      times.plan_reused = absl::StrContains(line, " plan_reused=true");
      times.planner_seconds = FieldSeconds(line, "planner_s");
      times.planner_cpu_seconds = FieldSeconds(line, "planner_cpu_s");
    } else if (event == "operation_committed") {
      times.committed = at;
    } else if (event == "operation_done") {
      times.done = at;
    } else if (event == "operation_aborted") {
      times.aborted = at;
      times.abort_line = std::string(line);
    }
  }
  return out;
}

}  // namespace ckpt::loadgen
