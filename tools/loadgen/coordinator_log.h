// Reads the phase events of operations out of a ckpt_coordinator log (one structured line per
// event, "<UTC time> <level> coordinator <event> op=<id> ..."): when each operation was
// gathered (last rank joined), planned, committed, done or aborted, as the coordinator saw it.
#ifndef CKPT_TOOLS_LOADGEN_COORDINATOR_LOG_H_
#define CKPT_TOOLS_LOADGEN_COORDINATOR_LOG_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::loadgen {

// The coordinator's timestamps of one operation's phase events (InfinitePast: not logged).
struct OperationLogTimes {
  absl::Time gathered = absl::InfinitePast();
  absl::Time planned = absl::InfinitePast();
  absl::Time committed = absl::InfinitePast();
  absl::Time done = absl::InfinitePast();
  absl::Time aborted = absl::InfinitePast();
  std::string abort_line;    // the whole operation_aborted line, when there is one
  bool plan_reused = false;  // the operation_planned line says plan_reused=true
  // The planning step's wall and CPU seconds (operation_planned's planner_s and
  // planner_cpu_s: the kind's Prepare, then its kept plan or its planner on the lent data;
  // CPU of the advancer and planner threads; -1: not logged).
  double planner_seconds = -1, planner_cpu_seconds = -1;
};

// Phase events by operation id. Lines that are not such events are skipped.
std::map<std::string, OperationLogTimes> ParseCoordinatorLog(absl::string_view text);

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_COORDINATOR_LOG_H_
