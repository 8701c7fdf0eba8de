// Names and summaries of jobs' operations (declared in job_state.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/job_state.h"

namespace ckpt::coordinator {

absl::string_view OperationKindName(OperationKind kind) {
  switch (kind) {
    case OperationKind::kSave:
      return "save";
    case OperationKind::kLoad:
      return "load";
    case OperationKind::kReshard:
      return "reshard";
  }
  return "unknown";
}

absl::StatusOr<OperationKind> ParseOperationKind(absl::string_view name) {
  for (OperationKind k : {OperationKind::kSave, OperationKind::kLoad, OperationKind::kReshard}) {
    if (name == OperationKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown operation kind \"", name, "\" (expected save, load or reshard)"));
}

absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kGathering:
      return "gathering";
    case Phase::kPlanning:
      return "planning";
    case Phase::kExecuting:
      return "executing";
    case Phase::kCommitting:
      return "committing";
    case Phase::kDone:
      return "done";
    case Phase::kAborted:
      return "aborted";
  }
  return "unknown";
}

std::string RankLocation::DebugString() const {
  if (worker_id.empty()) return "no worker attached";
  return absl::StrCat("host ", host.empty() ? "?" : host, ", worker ", worker_id, " (pid ",
                      worker_pid, ")");
}

int Operation::JoinedRanks() const { return totals.joined; }

int Operation::ReportedRanks() const { return totals.reported; }

int64_t Operation::BytesDone() const { return totals.bytes_done; }

int64_t Operation::BytesTotal() const { return totals.bytes_total; }

int64_t Operation::BytesRead() const { return totals.bytes_read; }

std::string Operation::DebugString() const {
  return absl::StrCat(id, " (", OperationKindName(kind), " of ", path, ", job ", job, ")");
}

}  // namespace ckpt::coordinator
