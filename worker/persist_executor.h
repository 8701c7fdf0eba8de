// The worker's side of background persistence (issue 17): executes the coordinator's
// PersistWork items (write these held files of a memory checkpoint into this staging
// directory) with PersistHeldFiles on its own executor thread, never the work stream's, and
// reports each item's outcome with ReportPersist until the coordinator acknowledges it. A
// PersistEnded item unpins the checkpoint in the memory tier (it was pinned when its save
// asked for persistence, so that it is never evicted before it is on storage). An item sent
// again (a re-opened work stream) is not written twice: its recorded result is re-sent.
#ifndef CKPT_WORKER_PERSIST_EXECUTOR_H_
#define CKPT_WORKER_PERSIST_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "worker/coordinator_link.h"
#include "worker/memory_tier.h"

namespace ckpt::worker {

// Test seam, called by the executor before it writes an item: true to write it, false when
// `stopped_within` (which waits up to the given time for the executor to stop, and says whether
// it did) reported a stop. Injected at link time: the release definition (persist_executor.cc)
// is weak and returns true at once; the testonly daemon //worker:ckpt_worker_testing links
// worker/test_hooks_on.cc, whose definition (--persist_gate_file=FILE) creates FILE.waiting and
// waits until FILE exists: a test orders a worker's death or a competing save against a
// persistence in progress with it.
bool PassPersistGateForTest(const std::function<bool(absl::Duration)>& stopped_within);

// What `tier` holds, with the coordinator's records, for RegisterWorkerRequest.memory_held.
std::vector<pb::HeldMemoryCheckpoint> DescribeHeld(const MemoryTier& tier);

// The executor. Thread-safe; Stop() (or the destructor) joins its thread.
class PersistExecutor {
 public:
  // `tier` (read through the pointer: null while the worker has no tier) and `link` must
  // outlive the executor.
  PersistExecutor(MemoryTier* const* tier, CoordinatorLink* link);
  ~PersistExecutor();

  // Handles a PersistWork (queued for the executor thread), a PersistEnded (unpins now) or a
  // MemoryCheckpointRecord (kept in the tier now).
  void Handle(const pb::WorkItem& item);
  void Stop();

 private:
  void Loop();
  // Writes the item's files and returns the report to send.
  pb::PersistReportRequest Run(const pb::PersistWork& work);
  // Sends `report` until acknowledged, refused for good, or stopping (bounded retries).
  void Report(const pb::PersistReportRequest& report);
  // PassPersistGateForTest, waiting on this executor's stop; false when stopping.
  bool PassGate();

  MemoryTier* const* tier_;
  CoordinatorLink* link_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                                 // guarded by mu_
  std::deque<pb::PersistWork> queue_;                     // guarded by mu_
  std::map<std::string, pb::PersistReportRequest> done_;  // by persist id; guarded by mu_
  std::deque<std::string> done_order_;                    // guarded by mu_
  std::map<std::string, bool> queued_;                    // persist ids queued or running
  std::thread thread_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_PERSIST_EXECUTOR_H_
