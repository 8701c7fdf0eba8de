// The only way a plan part touches its trainer's memory. Each operation running on a worker has
// one gate. When the operation is aborted (or the worker lost its lease, so the coordinator has
// aborted it) the gate closes: Close() returns only once no access through the gate is in
// progress, and none starts afterwards, so a worker that told its trainer "aborted" never writes
// the trainer's memory again. Large copies go in chunks, each entering the gate anew, so
// closing waits for one chunk at most and a cancelled copy stops between chunks.
//
// Thread-safe.
#ifndef CKPT_WORKER_MEMORY_GATE_H_
#define CKPT_WORKER_MEMORY_GATE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "sharding/overlap.h"

namespace ckpt::worker {

// See the file comment.
class MemoryGate {
 public:
  // Bytes one access may copy before the gate is entered again.
  static constexpr size_t kChunkBytes = size_t{8} << 20;

  // `precondition` (may be empty) is checked at every entry; a non-OK status closes the gate
  // with it (e.g. the worker's lease ran out while it was frozen).
  explicit MemoryGate(std::function<absl::Status()> precondition = nullptr);
  MemoryGate(const MemoryGate&) = delete;
  MemoryGate& operator=(const MemoryGate&) = delete;

  // Closes the gate with `reason` (kept from the first call; OK becomes Cancelled) and waits
  // until no access is in progress.
  void Close(const absl::Status& reason);
  // OK while open; the reason it closed otherwise.
  absl::Status status() const;
  bool closed() const { return !status().ok(); }

  // Runs `access` (which reads or writes trainer memory) with the gate held open; returns its
  // status, or the close reason without running it.
  absl::Status Run(absl::FunctionRef<absl::Status()> access);
  // memcpy in chunks of kChunkBytes, each through Run.
  absl::Status Copy(void* dst, const void* src, size_t bytes);
  // ckpt::CopyRuns in chunks of about kChunkBytes (long runs split, short ones batched).
  absl::Status CopyRuns(absl::Span<const CopyRun> runs, int64_t elem_size, const void* src,
                        void* dst);

 private:
  absl::Status Enter();
  void Exit();

  const std::function<absl::Status()> precondition_;
  mutable std::mutex mu_;
  std::condition_variable_any idle_;          // notified when the last access in progress ends
  absl::Status reason_ ABSL_GUARDED_BY(mu_);  // OK while open
  int active_ ABSL_GUARDED_BY(mu_) = 0;       // accesses in progress
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MEMORY_GATE_H_
