// A live-transfer receive's serving participant on a source worker (issue 17;
// coordinator/transfer_kinds.h): the coordinator adds each worker holding a published version's
// files to the receive's exchange as an extra rank with no requests and sends it a work item of
// kind OPERATION_RECEIVE. This executor runs that rank's part of the exchange-based load: it
// joins the receive's communicator, reads its units from this worker's memory tier (checksums
// verified) and sends them over the data plane straight to the destination's workers. No
// trainer is involved (the source trainer may be gone, or training on).
#ifndef CKPT_WORKER_TRANSFER_SERVE_H_
#define CKPT_WORKER_TRANSFER_SERVE_H_

#include "worker/part_executor.h"
#include "worker/part_executors.h"

namespace ckpt::worker {

// Serving parts (kind OPERATION_RECEIVE).
class TransferServeExecutor final : public PartExecutor {
 public:
  explicit TransferServeExecutor(LoadEnvironment environment) : env_(std::move(environment)) {}
  bool NeedsTrainer() const override { return false; }
  PartOutcome Execute(const PartRun& run) override;

 private:
  LoadEnvironment env_;
};

// Test seam, called by a serving part after each wave. Injected at link time: the release
// definition (transfer_serve.cc) is weak and does nothing; the testonly daemon
// //worker:ckpt_worker_testing links worker/test_hooks_on.cc, whose definition can stall the
// part (a source worker stalled mid-transfer, for a test to kill).
void HoldServingForTest(const MemoryGate& gate, const absl::Notification* stopping);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRANSFER_SERVE_H_
