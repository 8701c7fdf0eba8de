// Opens a committed checkpoint and reads pieces of it. Open validates the manifest and every
// data file's safetensors header against it; reads verify XXH3-64 checksums (whole pieces, or
// the covering blocks of partial reads) unless verification is explicitly skipped.
//
// A checkpoint is a directory (a plain path) or one in an object store (s3://bucket/prefix,
// storage/store_objects.h): there the manifest comes from the store, each data object's size
// is checked with a HEAD and its header with ranged GETs, and every read is a ranged GET of only
// the bytes needed, in parallel, verified the same way. Errors name the URL and the object.
#ifndef CKPT_STORAGE_CHECKPOINT_READER_H_
#define CKPT_STORAGE_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"
#include "sharding/region.h"
#include "storage/io_engine.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/safetensors.h"
#include "storage/store_objects.h"

namespace ckpt {

// What is at a checkpoint path.
enum class CheckpointState {
  kMissing,     // nothing there
  kIncomplete,  // a directory without manifest.pb: never loaded
  kComplete,    // manifest.pb present (validity is checked by Open)
  kNotADirectory,
};

// The state, plus any leftover staging/old sibling directories of interrupted writes.
struct CheckpointProbe {
  CheckpointState state = CheckpointState::kMissing;
  std::vector<std::string> leftovers;  // e.g. "/ckpts/.step5.tmp-123-0 (incomplete)"
};
CheckpointProbe ProbeCheckpoint(const std::string& path);
const char* CheckpointStateName(CheckpointState state);

// OK when `path` is a complete checkpoint directory (ProbeCheckpoint: kComplete); otherwise
// Open's error: NotFound when nothing is there, FailedPrecondition for an incomplete checkpoint
// or a path that is not a directory.
absl::Status CheckCheckpointComplete(const std::string& path);

// The safetensors header of data file `file` of the checkpoint in `dir`, parsed once the file's
// size is checked against the manifest's (DataLoss naming the file, "truncated" when shorter).
// Not checked against the manifest's pieces (CheckHeaderAgainstManifest does that).
absl::StatusOr<SafetensorsHeader> ReadDataFileHeader(const std::string& dir,
                                                     const pb::DataFile& file);

// The manifest of the checkpoint at `path` in bounded memory where the store allows it: for a
// directory, CheckCheckpointComplete then StreamManifestFile (storage/manifest_file.h; same
// errors); at an object-store URL, ReadStoreManifest (one GET of the manifest object, validated,
// before `deadline`) with its pieces then handed to `visit` in order. Returns the head (the
// manifest without pieces; at an object-store URL with its object_generation).
absl::StatusOr<pb::Manifest> StreamCheckpointManifest(const std::string& path,
                                                      ManifestPieceVisitor visit,
                                                      absl::Time deadline);

// Every data file `head` lists is at the checkpoint at `path` with its recorded size: a stat
// per file of a directory, a HEAD per object (under head.object_generation()) before
// `deadline` at an object-store URL. DataLoss naming the file or object ("truncated" when
// shorter); NotFound naming it when it is missing.
absl::Status CheckDataFileSizes(const std::string& path, const pb::Manifest& head,
                                absl::Time deadline);

struct ReaderOptions {
  IoOptions io;
  bool verify_checksums = true;
  // For a checkpoint in an object store: the deadline of Open's requests and of each batch of
  // reads (ReadPieces, ReadRegion(s)) is this long after it starts.
  absl::Duration store_timeout = absl::Minutes(10);
};

// A byte range [begin, end) of stored piece `piece` (index into manifest().pieces()) to copy
// to `dest`.
struct PieceRead {
  int piece = 0;
  int64_t begin = 0;
  int64_t end = 0;
  void* dest = nullptr;
};

// A byte range [begin, end) of stored piece `*piece` (of a validated manifest) to copy to
// `dest`.
struct StoredPieceRead {
  const pb::StoredPiece* piece = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
  void* dest = nullptr;
};

// CheckpointReader::ReadPieces for pieces no reader holds (e.g. streamed from the manifest):
// reads the ranges of pieces of the checkpoint in `dir`, whose manifest's checksum block size is
// `checksum_block_bytes`, in parallel; with `verify`, checks the covering checksum blocks of each
// range (the whole piece when it has no block checksums). InvalidArgument for a range outside
// its piece; DataLoss naming the tensor and entry for a checksum mismatch.
absl::Status ReadStoredPieces(const std::string& dir, int64_t checksum_block_bytes,
                              absl::Span<const StoredPieceRead> reads, bool verify,
                              const IoOptions& io);

// An opened, validated checkpoint. Thread-compatible; reads may run concurrently.
class CheckpointReader {
 public:
  // Opens the checkpoint at `path`: its whole manifest (ReadManifestFile; at an object-store
  // URL ReadStoreManifest), validated, and every data file's size and safetensors header
  // against it.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path,
                                                                const ReaderOptions& options = {});

  // Opens a part of the checkpoint at `path`: `share` is a manifest holding only some of its
  // pieces (those one load needs, as the coordinator sent them) with their tensors and data files
  // (coordinator/manifest_share.h's sense, but pieces are NOT at their original indices: only the
  // needed ones, in any order). Validates the share's format, each piece on its own (known tensor
  // and file, region valid for the tensor, byte length, entry name, inside its file's data
  // section, block checksum count), no two pieces sharing bytes (ValidateManifestShare), and each
  // data file the share lists against its safetensors header (size; each share piece's entry
  // present at its offsets: CheckHeaderAgainstShare); NOT that the pieces tile each tensor
  // (ReadRegion already refuses a region element stored by no piece, NotFound, or by two,
  // DataLoss). `path` must be a complete checkpoint directory, as for Open (same errors);
  // manifest.pb itself is not read. At an object-store URL nothing but the share's data
  // objects is read: those under the share's object_generation (the coordinator copies it
  // from the manifest; InvalidArgument naming the URL when the share has none). manifest() is
  // then the share, piece indices the share's. Errors name the piece (by its index in the
  // share) or the data file.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenShare(
      const std::string& path, pb::Manifest share, const ReaderOptions& options = {});

  const std::string& path() const { return path_; }
  // The data objects read, for a checkpoint in an object store; nullptr for a directory.
  const StoreObjects* objects() const { return objects_.get(); }
  // The manifest (of a share: the share), without an object_generation (objects() holds it).
  const pb::Manifest& manifest() const { return manifest_; }
  // The tensor's metadata, or nullptr.
  const pb::TensorMeta* FindTensor(const std::string& key) const;
  // Indices of the pieces of `key`, in manifest order.
  std::vector<int> PiecesOf(const std::string& key) const;

  // Reads the ranges (in parallel), verifying checksums per the options.
  absl::Status ReadPieces(const std::vector<PieceRead>& reads) const;
  absl::Status ReadPieces(const std::vector<PieceRead>& reads, bool verify) const;

  // Reads `region` of tensor `key` (row-major flattening of its box, narrowed to its flat
  // range) into `dest`, assembling it from every stored piece that overlaps it and reading
  // only the byte spans needed. Every element of `dest` is written exactly once: a region
  // element stored by no piece is NotFound, one stored twice DataLoss (Open already refuses
  // checkpoints whose pieces do not tile each tensor; this guards the buffer itself).
  absl::Status ReadRegion(const std::string& key, const Region& region, void* dest) const;

  // One region to read with ReadRegions.
  struct RegionRead {
    std::string key;
    Region region;
    void* dest = nullptr;
  };
  // ReadRegion for several regions at once, with all their reads in one parallel batch (for
  // many small tensors one call per tensor would cost more than the reads).
  absl::Status ReadRegions(absl::Span<const RegionRead> regions) const;

 private:
  CheckpointReader() = default;
  // The reader of validated `manifest` (a share's when `share`) of the checkpoint at `path`,
  // once each data file it lists passes CheckDataFile.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> FromManifest(
      const std::string& path, pb::Manifest manifest, const ReaderOptions& options, bool share);
  // Builds tensor_index_ and the pieces grouped by tensor from a validated manifest_.
  void IndexPieces(const ManifestIndex& index);
  std::string path_;
  pb::Manifest manifest_;
  ReaderOptions options_;
  std::unique_ptr<StoreObjects> objects_;  // set for a checkpoint in an object store
  // Key (viewing manifest_'s strings) -> tensor index.
  absl::flat_hash_map<absl::string_view, int> tensor_index_;
  // Piece indices grouped by tensor: tensor t's are [piece_start_[t], piece_start_[t + 1]).
  std::vector<int> pieces_by_tensor_;
  std::vector<int> piece_start_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_READER_H_
