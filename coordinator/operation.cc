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

int Operation::JoinedRanks() const {
  return static_cast<int>(
      std::count_if(ranks.begin(), ranks.end(), [](const RankEntry& r) { return r.joined; }));
}

int Operation::ReportedRanks() const {
  return static_cast<int>(std::count_if(ranks.begin(), ranks.end(),
                                        [](const RankEntry& r) { return r.result.has_value(); }));
}

int64_t Operation::BytesDone() const {
  int64_t n = 0;
  for (const RankEntry& r : ranks) n += r.bytes_done;
  return n;
}

int64_t Operation::BytesTotal() const {
  int64_t n = 0;
  for (const RankEntry& r : ranks) n += r.bytes_total;
  return n;
}

int64_t Operation::BytesRead() const {
  int64_t n = 0;
  for (const RankEntry& r : ranks) n += r.bytes_read;
  return n;
}

std::string Operation::DebugString() const {
  return absl::StrCat(id, " (", OperationKindName(kind), " of ", path, ", job ", job, ")");
}

}  // namespace ckpt::coordinator
