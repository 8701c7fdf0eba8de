// One kind of plan part (save, load, reshard) as the worker executes it. WorkerService keeps one
// registration per kind (RegisterPartExecutor) and runs the executor of a work item's kind on
// the part's own thread; no other code dispatches on the kind.
#ifndef CKPT_WORKER_PART_EXECUTOR_H_
#define CKPT_WORKER_PART_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"

namespace ckpt::worker {

// Reports bytes done so far (WorkerService forwards it to the coordinator, rate-limited).
using ProgressFn = std::function<void(int64_t bytes_done)>;

// What a part produced, for its ReportResult.
struct PartOutcome {
  absl::Status status;
  std::string written;     // save/reshard: the record of the files written
  int64_t bytes_read = 0;  // load/reshard: bytes read from storage
};

// One part to execute and what it may use.
struct PartRun {
  const pb::WorkItem& item;    // item.plan_part() is the serialized part of item.kind()
  const SessionInfo* session;  // the rank's trainer; nullptr when none is connected
  MemoryGate& gate;            // every access to the trainer's memory goes through it
  const ProgressFn& progress;
};

// Executes the plan parts of one operation kind. Thread-safe: parts of several operations run
// at once.
class PartExecutor {
 public:
  virtual ~PartExecutor() = default;
  // Whether the part reads or writes its trainer's memory: then WorkerService runs it only
  // while the rank's trainer is connected (run.session is never null).
  virtual bool NeedsTrainer() const = 0;
  // Runs the part; errors go into the outcome, naming what failed.
  virtual PartOutcome Execute(const PartRun& run) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_PART_EXECUTOR_H_
