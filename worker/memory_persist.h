// The worker's side of persisting a memory checkpoint (mem://<name>) to storage: the data files
// this worker holds in its memory tier are checked against the manifest's checksums and written,
// each fsynced, into the staging directory of the ordinary checkpoint the coordinator commits
// (storage/checkpoint_writer.h: CreateStagingDir, then CommitCheckpoint). The bytes are the ones
// a storage save of the same state writes (EncodeDataFile), so the committed checkpoint is the
// storage save's. Pure: no gRPC, no threads, no logging.
#ifndef CKPT_WORKER_MEMORY_PERSIST_H_
#define CKPT_WORKER_MEMORY_PERSIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "worker/memory_tier.h"

namespace ckpt::worker {

// Writes `files` (manifest names, "data/r<rank>_<index>.safetensors") of memory checkpoint
// `name` from `tier` into `staging_dir` (which has data/), fsyncing each file and data/.
// Before a byte is written every file is checked: it is listed in `manifest`, its size is the
// manifest's, and every piece in it matches its XXH3-64. Returns the bytes written. NotFound
// naming the worker, checkpoint and file for a file not held here; DataLoss naming the tensor
// and file for a mismatch; errno errors name the path. On error nothing of this call remains
// needed: the coordinator discards the staging directory or has another holder rewrite the file.
absl::StatusOr<int64_t> PersistHeldFiles(const MemoryTier& tier, const std::string& name,
                                         const pb::Manifest& manifest,
                                         const std::vector<std::string>& files,
                                         const std::string& staging_dir);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MEMORY_PERSIST_H_
