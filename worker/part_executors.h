// The worker's executors of save, load and reshard plan parts (PartExecutor): each parses its
// part, runs the matching executor (save_executor, load_executor / load_exchange_executor,
// reshard_executor) and logs one summary line.
#ifndef CKPT_WORKER_PART_EXECUTORS_H_
#define CKPT_WORKER_PART_EXECUTORS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "worker/coordinator_link.h"
#include "worker/host_buffer_pool.h"
#include "worker/memory_save.h"
#include "worker/memory_tier.h"
#include "worker/object_upload.h"
#include "worker/part_executor.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {

// What exchange-based loads need of the worker around them. Pointers must outlive the
// executor.
struct LoadEnvironment {
  CoordinatorLink* link = nullptr;  // rendezvous address and security, lease
  std::string host;                 // data-plane address when the link announces none
  const int* gloo_loop_thread_nice = nullptr;
  const absl::Notification* stopping = nullptr;  // the worker is shutting down
  PinnedStagingPool* device_staging = nullptr;   // the worker's pinned pool (null: no GPU)
  // The worker's memory tier (*memory_tier null: none), for mem:// saves and loads.
  MemoryTier* const* memory_tier = nullptr;
};

// Where a part's Gloo communicator meets (the coordinator's rendezvous) and which address this
// worker's data plane binds: the same for memory saves, exchange loads and transfer serving.
template <typename Context>
void FillDataPlaneEndpoint(const LoadEnvironment& env, Context* context) {
  context->rendezvous_address = env.link->options().coordinator;
  context->rendezvous_security = env.link->options().security;
  context->hostname = env.link->options().info.data_plane_address();
  if (context->hostname.empty()) context->hostname = env.host;
  if (env.gloo_loop_thread_nice != nullptr) {
    context->gloo_loop_thread_nice = *env.gloo_loop_thread_nice;
  }
}

// How save parts use the worker's host pool (worker/host_buffer_pool.h): set before serving.
struct HostSaveOptions {
  HostBufferPool* pool = nullptr;  // null: each save copies into buffers of its own
  bool direct_io = true;           // O_DIRECT writes where the filesystem allows
  // A save or reshard to a store URL (s3://...) writes its files here first, then uploads
  // them (worker/object_upload.h); "": $TMPDIR, else /tmp.
  std::string object_scratch_dir;
  // How long a rank's upload to a store may take.
  absl::Duration object_upload_timeout = absl::Hours(1);
};

// Save parts: snapshots the rank's part out of the trainer's memory (device pieces through the
// pinned staging pool), calls `on_snapshot` once the last byte has left the trainer's memory
// (the trainer may change its tensors from then on), then writes the snapshot's files (a
// memory save: keeps them in the worker's memory tier and replicates them, worker/memory_save.h).
class SavePartExecutor final : public PartExecutor {
 public:
  using SnapshotFn = std::function<void(const std::string& operation_id, int rank,
                                        const pb::SaveSnapshotReport& report)>;
  // `device_staging`: the worker's pinned pool (null: no GPU served; device pieces are
  // refused); it must outlive the executor.
  // `memory`: what a memory save (mem://) needs (the tier, the rendezvous and data plane).
  // `host_save` (may be null: no pool) is read at each part; it must outlive the executor.
  SavePartExecutor(SnapshotFn on_snapshot, PinnedStagingPool* device_staging,
                   LoadEnvironment memory = {}, const HostSaveOptions* host_save = nullptr)
      : on_snapshot_(std::move(on_snapshot)),
        device_staging_(device_staging),
        memory_(std::move(memory)),
        host_save_(host_save) {}
  bool NeedsTrainer() const override { return true; }
  PartOutcome Execute(const PartRun& run) override;

 private:
  SnapshotFn on_snapshot_;
  // How the part's snapshot is taken: the pinned pool and host pool a storage save uses, and
  // the report to the coordinator once the trainer's memory is drained.
  DeviceSnapshotOptions SnapshotOptions(const pb::WorkItem& item, const pb::SavePlanPart& part);
  // The memory save's context from memory_ (the link's rendezvous address and data plane).
  MemorySaveContext MemoryContext() const;

  PinnedStagingPool* device_staging_;
  LoadEnvironment memory_;
  const HostSaveOptions* host_save_;
};

// Load parts: direct reads (LOAD_DIRECT or unset) or the exchange-based load.
class LoadPartExecutor final : public PartExecutor {
 public:
  explicit LoadPartExecutor(LoadEnvironment environment) : env_(std::move(environment)) {}
  bool NeedsTrainer() const override { return true; }
  PartOutcome Execute(const PartRun& run) override;

 private:
  PartOutcome ExecuteExchange(const PartRun& run, const pb::LoadPlanPart& part);
  // After a failed exchange: waits (up to the lease) for the coordinator's abort, so that the
  // root cause, not this rank's symptom, reaches every rank.
  void AwaitAbort(const MemoryGate& gate) const;

  LoadEnvironment env_;
};

// Reshard parts: no trainer; reads the source checkpoint and writes the rank's target files.
class ReshardPartExecutor final : public PartExecutor {
 public:
  // `host_save` (may be null) says where a reshard to a store URL stages its files; it must
  // outlive the executor.
  explicit ReshardPartExecutor(const HostSaveOptions* host_save = nullptr)
      : host_save_(host_save) {}
  bool NeedsTrainer() const override { return false; }
  PartOutcome Execute(const PartRun& run) override;

 private:
  const HostSaveOptions* host_save_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_PART_EXECUTORS_H_
