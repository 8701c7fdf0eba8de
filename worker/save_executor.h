// Executes a worker's part of a save: writes the pieces the plan assigned to this rank, out of
// the trainer's host or device memory, into the save's staging directory (storage's safetensors
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
#include "storage/data_file_stream.h"
#include "storage/piece_codec.h"
#include "storage/piece_compression_stream.h"
#include "worker/host_buffer_pool.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"
#include "worker/save_write_pipeline.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {

// How a snapshot was taken (reported to the trainer with the snapshot signal).
struct SnapshotReport {
  int64_t copied_bytes = 0;         // host bytes copied out of the trainer's memory
  int64_t lent_bytes = 0;           // host bytes lent until durable: written in place, not copied
  StagingStats device;              // device pieces staged through the pinned pool (bytes 0: none)
  int64_t pinned_budget_bytes = 0;  // of the pool used (0: no device staging)
  // The device pieces did not fit in the pinned pool, so the signal waited until the chunks
  // staged first were written to their data files and their buffers reused: Save returned
  // after `bytes_written_before_snapshot` device bytes were written.
  bool waited_for_writes = false;
  int64_t bytes_written_before_snapshot = 0;
  // Pipelined saves (a host pool given): the host copies did not fit in the pool at once, so
  // the snapshot waited for the writes to return chunks (waited_for_writes then too).
  bool host_waited_for_pool = false;
  int64_t host_bytes_written_before_snapshot = 0;
  int64_t pool_chunks = 0;  // host pool chunks the copies went through
  // How the data files were written (final once WriteSnapshot returned): with O_DIRECT, or
  // buffered (not asked for, a file holding lent or device pieces, or O_DIRECT refused).
  int direct_io_files = 0;
  int buffered_files = 0;
  bool direct_io_refused = false;
  // A compressed save through the pool: its files of host pieces were encoded in the pipeline
  // (run k encoded and written while run k+1 was copied), `compressed_files` of them, holding
  // `compressed_raw_bytes` raw bytes in `compressed_stored_bytes` (final once WriteSnapshot
  // returned). False for an uncompressed save, and for a compressed one without a host pool
  // (encoded whole, file after file, by WriteDataFiles).
  bool compression_pipelined = false;
  int compressed_files = 0;
  int64_t compressed_raw_bytes = 0;
  int64_t compressed_stored_bytes = 0;
};

// A rank's save part taken out of the trainer's memory. Host pieces are copied into
// worker-owned buffers, so the trainer may change them once it exists and writing it produces
// the pre-change values; pieces the trainer lent until durable (RegisteredTensor::
// lent_until_durable) are not copied and are written from the trainer's shared mapping, which
// `mappings` keeps alive. Device pieces are not held at all: their bytes went from the pinned
// staging buffers straight into their data files (`streams`), which WriteSnapshot completes
// with the host pieces and finishes.
struct SaveSnapshot {
  int rank = 0;
  std::string job;
  std::string staging_dir;
  std::vector<TensorMeta> tensors;
  std::vector<DataFilePlan> files;      // host pieces point into `buffers` or `mappings`; device
                                        // pieces have no data (they are in `streams` already)
  std::vector<std::string> file_paths;  // as planned, for messages
  // Per file: the open data file its device pieces were streamed into (null for a file of
  // host pieces only, which WriteSnapshot writes whole).
  std::vector<std::unique_ptr<DataFileStream>> streams;
  std::vector<std::unique_ptr<char[]>> buffers;  // the copied bytes, one per copied host piece
  std::vector<std::shared_ptr<const MappedSegment>> mappings;  // of the lent pieces
  SnapshotReport report;
  // The part's compression (pb::SavePlanPart.compression). With a host pool (whose chunks hold
  // at least one codec chunk) the save is pipelined: each file without device pieces is a
  // CompressedFileStream in `packed`, its host pieces copied into pool chunks (or lent) and
  // encoded and written by `writer` (worker/save_write_pipeline.h). Without a pool the host
  // pieces are copied into buffers of their own and WriteSnapshot writes each file compressed
  // with WriteDataFiles, one file after another. Files holding device pieces are streamed, so
  // they are written raw either way.
  CompressionOptions compression;
  // Per file: the compressed file a pipelined compressed save writes (null for the others).
  std::vector<std::unique_ptr<CompressedFileStream>> packed;
  // A pipelined save (a host pool given): every file is open in `streams` and this writes the
  // copied chunks (then the lent pieces) into them; `buffers` stays empty and the copied
  // pieces have no data. Declared last: it stops before the streams and mappings go.
  std::unique_ptr<SaveWritePipeline> writer;
};

// Where device pieces go through, where host pieces are copied to, and who hears that they left
// the trainer's memory.
struct DeviceSnapshotOptions {
  PinnedStagingPool* staging = nullptr;  // null: device pieces are FailedPrecondition
  // The worker's host pool. Given: the save is pipelined: host pieces are copied into pool
  // chunks in file order while a writer thread hashes and writes the chunks copied before
  // (O_DIRECT when `direct_io`, for files of copied pieces only; a compressed save's files are
  // encoded first, buffered) and returns them; when the save exceeds the pool the copy waits
  // for the writes. Null: host pieces are copied into buffers of their own, held in the
  // snapshot (memory saves keep them).
  HostBufferPool* host_pool = nullptr;
  bool direct_io = true;
  // Hears each pool chunk copied and written (for logs and tests; may be empty).
  std::function<void(const SavePipelineEvent&)> trace;
  // Called once every byte of this rank's device pieces has left device memory (and the host
  // pieces are copied; lent pieces need no copy): the trainer may overwrite its tensors from
  // then on. The report's device figures are final when it is called.
  std::function<void(const SnapshotReport&)> on_device_drained;
  absl::Duration timeout = absl::Minutes(10);  // for the pool and each copy
};

// Checks `part` against the session (see ExecuteSavePart) and takes the pieces it writes out
// of the trainer's memory: host pieces are copied through `gate` in chunks (a closed gate stops
// the copy with its reason; lent ones are not copied; with device.host_pool the copies go into
// pool chunks, written while the next are copied, see DeviceSnapshotOptions), then the data
// files holding device
// pieces are created in the staging directory and the device pieces are staged off the device
// through `device.staging` in chunks (see worker/staging_pipeline.h), each chunk written and
// hashed into its file while the next one is copied. Errors name the rank, tensor and file.
absl::StatusOr<SaveSnapshot> SnapshotSavePart(const pb::SavePlanPart& part,
                                              const SessionInfo& session, MemoryGate& gate,
                                              const DeviceSnapshotOptions& device = {});

// Writes a snapshot's data files into its staging directory, one at a time (the host pieces of
// a file that device pieces were streamed into are appended to it, then it is finished);
// returns the record of what it wrote (serialized pb::Manifest with pieces and files).
// `cancelled`, checked before each file, stops the write with Cancelled (the operation was
// aborted meanwhile).
absl::StatusOr<std::string> WriteSnapshot(SaveSnapshot& snapshot,
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
