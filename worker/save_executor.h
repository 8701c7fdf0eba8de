// Executes a worker's part of a save: writes the pieces the plan assigned to this rank, straight
// from the trainer's shared memory, into the save's staging directory (storage's safetensors
// data files, fsynced), and returns the record of what it wrote for the coordinator's commit.
// No gRPC, no logging.
#ifndef CKPT_WORKER_SAVE_EXECUTOR_H_
#define CKPT_WORKER_SAVE_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_writer.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {

// How a snapshot was taken (reported to the trainer with the snapshot signal).
struct SnapshotReport {
  int64_t copied_bytes = 0;         // host bytes copied out of the trainer's memory
  int64_t lent_bytes = 0;           // host bytes lent until durable: written in place, not copied
  StagingStats device;              // device pieces staged through the pinned pool (bytes 0: none)
  int64_t pinned_budget_bytes = 0;  // of the pool used (0: no device staging)
};

// A rank's save part taken out of the trainer's memory: its own pieces are copied into
// worker-owned buffers, so the trainer may change them once it exists and writing it produces
// the pre-change values; pieces the trainer lent until durable (RegisteredTensor::
// lent_until_durable) are not copied and are written from the trainer's shared mapping, which
// `mappings` keeps alive.
struct SaveSnapshot {
  int rank = 0;
  std::string job;
  std::string staging_dir;
  std::vector<TensorMeta> tensors;
  std::vector<DataFilePlan> files;               // pieces point into `buffers`
  std::vector<std::string> file_paths;           // as planned, for messages
  std::vector<std::unique_ptr<char[]>> buffers;  // the copied bytes, one per copied piece
  std::vector<std::shared_ptr<const MappedSegment>> mappings;  // of the lent pieces
  SnapshotReport report;
};

// Where device pieces go through, and who hears that they left the device.
struct DeviceSnapshotOptions {
  PinnedStagingPool* staging = nullptr;  // null: device pieces are FailedPrecondition
  // Called once every byte of this rank's device pieces has left device memory (and the host
  // pieces are copied; lent pieces need no copy): the trainer may overwrite its tensors from
  // then on. The report's device figures are final when it is called.
  std::function<void(const SnapshotReport&)> on_device_drained;
  absl::Duration timeout = absl::Minutes(10);  // for the pool and each copy
};

// Checks `part` against the session (see ExecuteSavePart) and copies the pieces it writes,
// through `gate` in chunks (a closed gate stops the copy with its reason). Host pieces are
// copied first (lent ones are not copied), then device pieces are staged off the device through
// `device.staging` in chunks (see worker/staging_pipeline.h) into the snapshot's buffers.
absl::StatusOr<SaveSnapshot> SnapshotSavePart(const pb::SavePlanPart& part,
                                              const SessionInfo& session, MemoryGate& gate,
                                              const DeviceSnapshotOptions& device = {});

// Writes a snapshot into its staging directory, one data file at a time; returns the record
// of what it wrote (serialized pb::Manifest with pieces and files).
// `cancelled`, checked before each file, stops the write with Cancelled (the operation was
// aborted meanwhile).
absl::StatusOr<std::string> WriteSnapshot(const SaveSnapshot& snapshot,
                                          const std::function<void(int64_t bytes_done)>& progress,
                                          const std::function<bool()>& cancelled = nullptr);

// Snapshot + write. Writes `part` for the rank whose registered state is `session` (piece i of a
// file is the session's tensor part.files(f).pieces(i).local_index(), which must match its key and
// region). Returns a serialized pb::Manifest holding the written pieces and files. Errors name the
// rank, tensor key and file.
// `progress(bytes_done)` is called after each data file is written and synced.
absl::StatusOr<std::string> ExecuteSavePart(
    const pb::SavePlanPart& part, const SessionInfo& session,
    const std::function<void(int64_t bytes_done)>& progress = nullptr);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SAVE_EXECUTOR_H_
