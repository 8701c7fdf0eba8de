// Writes a checkpoint directory with the atomic commit protocol:
//   1. create a temporary sibling directory <parent>/.<name>.tmp-<pid>-<n> with data/;
//   2. write every data file (safetensors) and fsync it; fsync data/ and the directory;
//   3. write the manifest's piece files if it needs them (fsync each, then the directory), then
//      manifest.pb.tmp, fsync it, rename it to manifest.pb, fsync the directory;
//   4. rename the directory to its final name (atomically exchanging it with an existing
//      checkpoint when overwriting is allowed), fsync the parent, then remove the old one.
// A crash at any point leaves the previous checkpoint or the complete new one under the final
// name. Data file names come from the writer rank and a counter, never from tensor keys.
#ifndef CKPT_STORAGE_CHECKPOINT_WRITER_H_
#define CKPT_STORAGE_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "sharding/region.h"
#include "sharding/tensor_meta.h"
#include "storage/io_engine.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/piece_codec.h"

namespace ckpt {

// One piece to store: `region` of tensor `key`, whose bytes (row-major flattening of the
// region's box, narrowed to its flat range) are at `data`. The memory must stay valid while
// the write runs.
struct PieceData {
  std::string key;
  Region region;
  const void* data = nullptr;
  int64_t size_bytes = 0;
};

// The pieces of one data file and the rank that writes it.
struct DataFilePlan {
  int writer_rank = 0;
  std::vector<PieceData> pieces;
};

// Everything that goes into one checkpoint.
struct CheckpointContents {
  std::vector<TensorMeta> tensors;
  std::vector<DataFilePlan> files;
  pb::SavedLayout saved_layout;
  int64_t step = 0;
  std::map<std::string, std::string> user_metadata;
};

// Points of the commit protocol, in order; the test hook runs after each one completes.
enum class CommitStep {
  kStagingCreated,
  kDataFilesSynced,
  kStagingDirSynced,
  kManifestTempWritten,
  kManifestRenamed,
  kManifestDirSynced,
  kCheckpointRenamed,
  kOldRemoved,
};
inline constexpr CommitStep kAllCommitSteps[] = {
    CommitStep::kStagingCreated,      CommitStep::kDataFilesSynced, CommitStep::kStagingDirSynced,
    CommitStep::kManifestTempWritten, CommitStep::kManifestRenamed, CommitStep::kManifestDirSynced,
    CommitStep::kCheckpointRenamed,   CommitStep::kOldRemoved};
const char* CommitStepName(CommitStep step);
absl::StatusOr<CommitStep> ParseCommitStep(absl::string_view name);

struct WriteOptions {
  IoOptions io;
  // Replace an existing committed checkpoint at the final path. An empty directory there is
  // always replaced, keeping its mode (removed with rmdir right before the no-replace rename, so
  // nothing that appears in it is lost). Without it any other existing path is AlreadyExists and
  // nothing is written; with it anything but a committed checkpoint (storage/overwrite_guard.h: a
  // file, a link, an arbitrary or incomplete directory) is FailedPrecondition and nothing is
  // written or removed.
  bool overwrite = false;
  int64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  // CommitCheckpoint skips ValidateManifest: the caller checked the manifest as it would
  // (e.g. the same ManifestShapeOf as a manifest that passed it, and CheckPieceChecksums).
  bool manifest_validated = false;
  // When the manifest is split into piece files, and their size (storage/manifest_file.h).
  ManifestFileOptions manifest_files;
  // Compress the pieces WriteDataFiles writes (storage/piece_codec.h; off by default).
  CompressionOptions compression;
  // Test-only: called after each commit step (e.g. to kill the process there).
  std::function<void(CommitStep)> after_step;
};

// Writes `contents` as a checkpoint at `path` with the commit protocol; returns the manifest.
absl::StatusOr<pb::Manifest> WriteCheckpoint(const std::string& path,
                                             const CheckpointContents& contents,
                                             const WriteOptions& options);

// --- the same protocol in parts, for saves spread over several processes ---------------------

// Creates the temporary sibling directory (with data/) for a checkpoint at `final_path`.
// Accepts an empty directory at the path (the commit replaces it). Refuses any other existing
// path (AlreadyExists, naming a few entries of a directory) unless `overwrite`, and with it
// anything at the path that is not a committed checkpoint (FailedPrecondition, see
// CheckReplaceable).
absl::StatusOr<std::string> CreateStagingDir(const std::string& final_path, bool overwrite);

// Removes the staging directory of a checkpoint that will not be committed, while writers in
// other processes may still be writing into it: it is renamed away first (a writer's next file
// then fails to open instead of appearing in a directory being removed), then removed.
absl::Status DiscardStagingDir(const std::string& staging_dir);

// What WriteDataFiles produced: the stored pieces and file records for the manifest.
struct WrittenData {
  std::vector<pb::StoredPiece> pieces;
  std::vector<pb::DataFile> files;
};

// Writes `files` into <staging_dir>/data/ as r<rank>_<first_index + i>.safetensors (i counted
// per rank), fsyncs them, and returns their manifest records. Pieces are validated against
// `tensors` (known key, valid region, size = elements * dtype size).
absl::StatusOr<WrittenData> WriteDataFiles(const std::string& staging_dir,
                                           const std::vector<TensorMeta>& tensors,
                                           const std::vector<DataFilePlan>& files, int first_index,
                                           const WriteOptions& options);

// One data file laid out before any of its bytes is written: its name (data/r<rank>_<index>
// .safetensors), its safetensors header and the manifest records of the file and its pieces
// (offsets and lengths; checksums are set once the bytes were hashed).
struct DataFileLayout {
  std::string name;
  std::string header;
  WrittenData records;
};

// Validates `plan`'s pieces against `tensors` as WriteDataFiles does and lays the file out.
// With `require_data` false the pieces' `data` may be null (their bytes are streamed in later,
// see storage/data_file_stream.h).
absl::StatusOr<DataFileLayout> LayOutDataFile(const std::vector<TensorMeta>& tensors,
                                              const DataFilePlan& plan, int index,
                                              bool require_data);

// Stores a piece's checksums as the manifest records them: `xxh3` (the RangeChecksum of the
// blocks) always, the block hashes only for a piece larger than one block.
void SetStoredChecksums(uint64_t xxh3, const std::vector<uint64_t>& blocks,
                        int64_t checksum_block_bytes, pb::StoredPiece* piece);

// A manifest for `tensors` and the written data (format version, time, writer version filled).
pb::Manifest BuildManifest(const std::vector<TensorMeta>& tensors, const WrittenData& data,
                           const CheckpointContents& info, int64_t checksum_block_bytes);
// The same manifest, with `data`'s pieces and files moved into it instead of copied.
pb::Manifest BuildManifest(const std::vector<TensorMeta>& tensors, WrittenData&& data,
                           const CheckpointContents& info, int64_t checksum_block_bytes);

// Steps 2 (directory fsyncs) to 4 of the protocol for a staging dir whose data files are
// written and synced. Validates the manifest first (unless options.manifest_validated). When
// overwriting, what is at the final path is checked again right before the swap (CheckReplaceable),
// and after the swap the directory swapped out must be the one checked, or it is swapped back and
// nothing removed.
absl::Status CommitCheckpoint(const std::string& staging_dir, const std::string& final_path,
                              const pb::Manifest& manifest, const WriteOptions& options);

// CommitCheckpoint for a manifest that is never whole in memory: `head` (the manifest without
// its pieces) and the pieces `source` hands over, `pieces_bytes` in all (PieceRecordBytes
// each), are streamed into manifest.pb.tmp, or into piece files and then manifest.pb.tmp
// (WriteManifestFiles with options.manifest_files). The source checks the pieces as it goes
// (e.g. with ManifestValidator: the commit itself validates nothing). Its error ends the commit
// before the manifest is renamed into place; the partial files are removed.
absl::Status CommitStreamedCheckpoint(const std::string& staging_dir, const std::string& final_path,
                                      const pb::Manifest& head, int64_t pieces_bytes,
                                      ManifestPieceSource source, const WriteOptions& options);

// Splits pieces into `num_files` data files of roughly equal bytes (largest first, each to the
// lightest file), all written by `writer_rank`. Empty files are dropped.
std::vector<DataFilePlan> BalanceIntoFiles(std::vector<PieceData> pieces, int num_files,
                                           int writer_rank);

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_WRITER_H_
