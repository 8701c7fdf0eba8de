// The worker's in-memory checkpoint tier: the data files of memory checkpoints (mem://<name>),
// byte for byte what a storage save would write (safetensors layout + the manifest's XXH3-64
// checksums), held in this worker's memory: its own ranks' files and the replicas it keeps
// for ranks on other hosts. Bounded by a byte budget and, per retention group (the versions of
// one published transfer name; or all plain memory checkpoints), a count of complete
// checkpoints kept.
// Pure: no gRPC, no threads of its own, no logging; thread-safe.
#ifndef CKPT_WORKER_MEMORY_TIER_H_
#define CKPT_WORKER_MEMORY_TIER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::worker {

// Limits of one worker's tier.
struct MemoryTierOptions {
  int64_t budget_bytes = int64_t{1} << 30;  // bytes of data files held at most
  int keep_newest = 2;                      // complete checkpoints kept (older ones evicted)
  std::string worker = "this worker";       // for messages ("worker w-1 (host a)")
};

// One data file encoded in memory: its bytes and its manifest records.
struct EncodedFile {
  std::string name;  // "data/r<rank>_<index>.safetensors"
  std::shared_ptr<const std::string> bytes;
  WrittenData records;  // one DataFile and its StoredPieces, checksums set
};

// Encodes file `index` of `plan` exactly as WriteDataFiles would write it (same header,
// offsets, checksums over `checksum_block_bytes` blocks), into memory. Pieces must have data.
absl::StatusOr<EncodedFile> EncodeDataFile(const std::vector<TensorMeta>& tensors,
                                           const DataFilePlan& plan, int index,
                                           int64_t checksum_block_bytes);

// What the tier holds of one checkpoint.
struct HeldCheckpoint {
  std::string name;
  std::string operation_id;  // of the save that produced it
  bool complete = false;     // Seal()ed: the save's part (with its replicas) succeeded here
  bool pinned = false;       // awaiting persistence to storage: never evicted (Pin)
  int64_t bytes = 0;
  std::vector<std::string> files;
  std::string group;  // retention group ("": plain memory checkpoints; "xfer:<name>")
  // The coordinator's record of the committed checkpoint (serialized
  // pb::MemoryCheckpointRecord; "" until its commit was recorded here, see Record).
  std::string record;
  std::string persist_outcome;  // how its persistence ended ("" while pinned or never asked)
};

// The store. Checkpoints are ordered by when their first file arrived.
class MemoryTier {
 public:
  explicit MemoryTier(MemoryTierOptions options) : options_(std::move(options)) {}

  // Keeps `bytes` as `file` of checkpoint `name`, written by save `operation_id` (a copy of
  // `name` from another operation, left by a save that never committed, is dropped first).
  // When the budget cannot take it, complete checkpoints are evicted oldest first, never the
  // newest complete one of any retention group (the last durable copy of that name) nor one in
  // progress or awaiting persistence; if it still does not fit,
  // ResourceExhausted naming the worker, the checkpoint, the file and the bytes (nothing is
  // evicted then).
  absl::Status Put(const std::string& name, const std::string& operation_id,
                   const std::string& file, std::shared_ptr<const std::string> bytes);
  // Marks `name` complete in retention `group`, then evicts the group's complete checkpoints
  // beyond its newest `keep_newest` (0: the options' keep_newest); other groups are untouched.
  void Seal(const std::string& name, int keep_newest = 0, const std::string& group = "");
  // Forgets `name` (an aborted save's files).
  void Drop(const std::string& name);
  // Pins `name` (kept even when it does not exist yet): a checkpoint awaiting persistence to
  // storage is never evicted, neither for the budget nor by keep-newest, until Unpin.
  void Pin(const std::string& name);
  // Ends the pin of `name` (persisted, or its persistence failed: `outcome` says which) and
  // applies its group's keep-newest (the count of the group's last Seal) again.
  void Unpin(const std::string& name, const std::string& outcome = "");
  // Keeps the coordinator's `record` (opaque here) of committed checkpoint `name`, so that a
  // restarted coordinator can be told what it committed; false (nothing kept) when `name` is
  // not held complete here.
  bool Record(const std::string& name, std::string record);
  // The bytes of `file` of `name`; NotFound naming the worker, checkpoint and file.
  absl::StatusOr<std::shared_ptr<const std::string>> Find(const std::string& name,
                                                          const std::string& file) const;
  std::vector<HeldCheckpoint> List() const;
  // The names of the checkpoints evicted (budget or keep-newest) since the last call (the
  // newest 1024), for the coordinator's catalog.
  std::vector<std::string> TakeEvicted();
  int64_t held_bytes() const;
  const MemoryTierOptions& options() const { return options_; }

 private:
  struct Entry {
    int64_t sequence = 0;
    std::string operation_id;
    bool complete = false;
    bool pinned = false;
    int64_t bytes = 0;
    std::map<std::string, std::shared_ptr<const std::string>> files;
    std::string record;           // see HeldCheckpoint
    std::string persist_outcome;  // see HeldCheckpoint
    std::string group;            // see HeldCheckpoint
  };
  // Evicts complete checkpoints (oldest first, never the newest complete one, never `keep`)
  // until `needed` more bytes fit; false (nothing evicted) when they cannot.
  bool MakeRoomLocked(int64_t needed, const std::string& keep);
  // Evicts complete, unpinned checkpoints of `group` beyond its newest `keep` complete ones.
  void KeepNewestLocked(int keep, const std::string& group);

  const MemoryTierOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;      // guarded by mu_
  int64_t held_ = 0;                          // guarded by mu_
  int64_t next_sequence_ = 0;                 // guarded by mu_
  std::map<std::string, int> keep_of_group_;  // keep-newest of each group's last Seal; mu_
  std::vector<std::string> evicted_;          // since the last TakeEvicted; guarded by mu_
  // Records an eviction of `name` for TakeEvicted. Requires mu_.
  void NoteEvictedLocked(const std::string& name);
};

// Reads byte ranges of stored pieces of a memory checkpoint described by `manifest` from the
// files `tier` holds under `name`, verifying the pieces' checksums (the covering blocks of a
// partial read, or the whole piece) as CheckpointReader::ReadPieces does. DataLoss for a
// mismatch, NotFound for a file this worker does not hold; errors name the tensor and file.
absl::Status ReadHeldPieces(const MemoryTier& tier, const std::string& name,
                            const pb::Manifest& manifest, const std::vector<PieceRead>& reads);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MEMORY_TIER_H_
