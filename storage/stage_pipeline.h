// Two overlapping stages over a sequence of steps with bounded memory: step k is produced into
// one of two slots (e.g. read into a buffer) while step k - 1 is consumed from the other (e.g.
// written out) on a second thread. A slot is produced into again only after its previous step
// was consumed, so memory holds at most two steps' buffers, which the caller allocates once and
// reuses. Used by the offline paths (export, import, reshard assembly) instead of alternating
// read-a-batch, write-the-batch loops.
#ifndef CKPT_STORAGE_STAGE_PIPELINE_H_
#define CKPT_STORAGE_STAGE_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"

namespace ckpt {

// A buffer reused across the steps (and files) of an operation: grown to the largest request,
// never shrunk or given back while it lives, since fresh memory is faulted in at a fraction of
// the speed of memory already touched. Not thread-safe; each slot of a pipeline has its own.
class ReusedBuffer {
 public:
  // At least `bytes` (>= 1) bytes; the old contents are dropped when it must grow.
  char* Get(int64_t bytes);
  char* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  int64_t allocations() const { return allocations_; }

 private:
  std::unique_ptr<char[]> data_;
  int64_t size_ = 0;
  int64_t allocations_ = 0;
};

// What the buffers of an offline path did (for tests and benchmarks).
struct PipelineStats {
  int64_t steps = 0;               // batches or chunks through the pipeline
  int64_t buffer_allocations = 0;  // times a reused buffer had to grow
  int64_t peak_buffer_bytes = 0;   // all its buffers together, at the end
};

// One stage's work on step `step` using slot `slot` (step % 2).
using PipelineStage = std::function<absl::Status(int64_t step, int slot)>;

// Runs steps 0 .. steps - 1: produce(k, k % 2) on the caller's thread, then consume(k, k % 2) on
// a second thread, overlapping produce(k + 1). Order guarantees: consume(k) starts after
// produce(k) returned and after consume(k - 1) returned; produce(k + 2) starts after consume(k)
// returned (back-pressure: a slot is never refilled while it is being drained). Returns the
// first error in step order (a consume error of step k before a produce error of step k + 1),
// and only after the running consume has returned; nothing runs after an error. With
// `overlap` false the stages alternate on the caller's thread (the old behaviour, for
// comparison).
absl::Status RunStagePipeline(int64_t steps, const PipelineStage& produce,
                              const PipelineStage& consume, bool overlap = true);

}  // namespace ckpt

#endif  // CKPT_STORAGE_STAGE_PIPELINE_H_
