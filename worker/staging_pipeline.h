// The worker's device staging: a pinned host pool allocated once per worker and reused by every
// save and load, and the chunked, multi-buffered pipelines that move trainer device memory
// through it with a CopyEngine.
//
// Device to host (saves): chunk k+1.. are being copied off the device while chunk k is handed
// to the consumer; once every chunk is issued the pipeline waits for the last copy and signals
// "drained": every device byte has left device memory (the trainer may overwrite its tensors).
// When the ranges exceed the pool, later chunks wait for buffers the consumer released, so the
// signal comes later (StagingStats::over_budget and bytes_consumed_before_drained say so).
// Host to device (loads): the producer fills chunk k+1 (e.g. reads it from storage) while chunk
// k is copied to the device.
//
// Every error names `who` (rank and job), the tensor and the bytes. No gRPC, no logging.
#ifndef CKPT_WORKER_STAGING_PIPELINE_H_
#define CKPT_WORKER_STAGING_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "device/copy_engine.h"

namespace ckpt::worker {

// The pool. Thread-safe; one pipeline holds its buffers at a time (a Lease).
class PinnedStagingPool {
 public:
  static constexpr int64_t kDefaultChunkBytes = int64_t{8} << 20;

  // `budget_bytes` of pinned memory in buffers of `chunk_bytes` (less when the budget holds
  // fewer than two chunks: then two buffers of half the budget). Nothing is allocated yet.
  PinnedStagingPool(CopyEngine* engine, int64_t budget_bytes,
                    int64_t chunk_bytes = kDefaultChunkBytes);

  CopyEngine* engine() const { return engine_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  int num_buffers() const { return num_buffers_; }
  int64_t capacity_bytes() const { return chunk_bytes_ * num_buffers_; }

  // Exclusive use of the buffers until destroyed.
  class Lease {
   public:
    Lease(Lease&&) = default;
    CopyEngine* engine() const { return pool_->engine_; }
    int64_t chunk_bytes() const { return pool_->chunk_bytes_; }
    absl::Span<PinnedBuffer> buffers() const { return absl::MakeSpan(pool_->buffers_); }

   private:
    friend class PinnedStagingPool;
    Lease(PinnedStagingPool* pool, std::unique_lock<std::timed_mutex> lock)
        : pool_(pool), lock_(std::move(lock)) {}
    PinnedStagingPool* pool_;
    std::unique_lock<std::timed_mutex> lock_;
  };

  // Waits (until `deadline`: DeadlineExceeded) for the pipeline holding the buffers; allocates
  // them on the first call (InvalidArgument for a budget under 8 KiB; the engine's error when
  // pinning fails, and the next call tries again).
  absl::StatusOr<Lease> Acquire(absl::Time deadline);

 private:
  CopyEngine* engine_;
  int64_t budget_bytes_;
  int64_t chunk_bytes_;
  int num_buffers_;
  std::timed_mutex mu_;
  std::vector<PinnedBuffer> buffers_;  // allocated once, under mu_
};

// Device memory of one tensor (or part of it).
struct DeviceRange {
  std::string key;
  void* device = nullptr;  // device to host: the source; host to device: the destination
  int64_t bytes = 0;
};

// A chunk in a pinned buffer: bytes [offset, offset + bytes) of ranges[range].
struct StagedChunk {
  int range = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
  std::byte* host = nullptr;
};

// What a pipeline did.
struct StagingStats {
  int64_t bytes = 0;
  int64_t chunks = 0;
  bool over_budget = false;      // the ranges did not fit in the pool at once
  absl::Duration until_drained;  // device to host: from start to the "drained" signal
  // Device to host: bytes the consumer took (e.g. wrote to storage) before the "drained"
  // signal, so that their buffers could take later chunks: the signal waited for them.
  int64_t bytes_consumed_before_drained = 0;
};

// Device to host, see the file comment. `stop` (may be empty) is asked before each chunk is
// issued; its error stops the pipeline (after the copies in flight completed). `consume` gets
// the chunks in order (range by range, offset by offset); `on_drained` (may be empty) is called
// once, after the last copy completed and before the chunks still in buffers are consumed.
// An empty set of ranges is drained at once.
absl::Status StageDeviceToHost(PinnedStagingPool::Lease& lease,
                               absl::Span<const DeviceRange> ranges, const std::string& who,
                               const std::function<absl::Status()>& stop,
                               const std::function<absl::Status(const StagedChunk&)>& consume,
                               const std::function<void()>& on_drained, absl::Time deadline,
                               StagingStats* stats);

// A chunk the host-to-device pipeline fills and copies (bytes <= the lease's chunk bytes).
struct ChunkSpec {
  int range = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Cuts every range into chunks of at most `chunk_bytes`, in order.
std::vector<ChunkSpec> CutIntoChunks(absl::Span<const DeviceRange> ranges, int64_t chunk_bytes);

// Host to device, see the file comment: for each chunk in order, `produce` fills chunk.host
// with bytes [offset, offset + bytes) of ranges[range] and the engine copies them to
// ranges[range].device + offset. Returns once every copy completed (or the first error, after
// the copies in flight completed).
absl::Status StageHostToDevice(PinnedStagingPool::Lease& lease,
                               absl::Span<const DeviceRange> ranges,
                               absl::Span<const ChunkSpec> chunks, const std::string& who,
                               const std::function<absl::Status()>& stop,
                               const std::function<absl::Status(const StagedChunk&)>& produce,
                               absl::Time deadline, StagingStats* stats);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_STAGING_PIPELINE_H_
