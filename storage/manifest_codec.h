// The checkpoint manifest (<checkpoint>/manifest.pb): conversions between the wire types and the
// sharding library, serialization, and strict validation. Pure: no I/O, no threads.
#ifndef CKPT_STORAGE_MANIFEST_CODEC_H_
#define CKPT_STORAGE_MANIFEST_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "sharding/region.h"
#include "storage/safetensors.h"

namespace ckpt {

// The manifest format of a manifest that fits in manifest.pb (every manifest but a huge one).
inline constexpr uint32_t kManifestFormatVersion = 1;
// The format of a manifest whose pieces are stored in piece files beside manifest.pb (its
// piece_files, in order; its own pieces empty). Readers accept both formats.
inline constexpr uint32_t kManifestPieceFilesFormatVersion = 2;
// Most piece files a manifest may list (ManifestPieceFileName has 5 digits).
inline constexpr int kMaxManifestPieceFiles = 10000;
// Written into Manifest.writer_version.
inline constexpr char kWriterVersion[] = "ckpt-storage 1.0";
// Largest manifest file we read (a guard against garbage, not a design limit).
inline constexpr int64_t kMaxManifestBytes = int64_t{1} << 31;
// Default block size of StoredPiece.block_xxh3.
inline constexpr int64_t kDefaultChecksumBlockBytes = int64_t{4} << 20;

// The region of a piece of a manifest that passed ValidateManifest (conversions between wire
// and sharding types live in proto/convert.h; this is the infallible form for validated data:
// an empty Region if the proto were malformed, which validation rules out).
Region PieceRegion(const pb::StoredPiece& piece);

// The bytes a piece takes in its data file: stored_length for a compressed piece (codec set),
// else byte_length. The stored checksums (xxh3_64, block_xxh3) cover these bytes.
inline int64_t StoredBytes(const pb::StoredPiece& piece) {
  return piece.codec() != 0 ? piece.stored_length() : piece.byte_length();
}

// "data/r<rank>_<index>.safetensors": data file names come from the writer's rank and a
// counter, never from tensor keys.
std::string DataFileName(int writer_rank, int index);

// Accepts only "data/<name>.safetensors" with <name> of [A-Za-z0-9._-], not starting with '.'.
absl::Status ValidateDataFileName(absl::string_view name);

// "manifest-pieces-<index, 5 digits>.pb": the name of a manifest's index-th piece file,
// relative to the checkpoint directory (never from user input).
std::string ManifestPieceFileName(int index);

// Whether `name` is ManifestPieceFileName(i) for some i in [0, kMaxManifestPieceFiles).
bool IsManifestPieceFileName(absl::string_view name);

// Full structural validation: known format version (1 without piece files; 2 with 1 to
// kMaxManifestPieceFiles piece files named ManifestPieceFileName(0, 1, ...) in order, each of
// at least one piece, whose counts add up to the manifest's pieces: a format-2 manifest is
// validated once its piece files' pieces are appended, see ReadManifestFile); unique, non-empty
// tensor keys with valid dtypes and shapes; valid, unique data file names; every piece refers to a
// known tensor and file, has a region valid for its tensor, a byte length equal to elements * dtype
// size, an entry name equal to EncodeEntryName(key, region), lies inside its file's data section,
// has the right number of block checksums; no duplicate pieces; no overlapping byte ranges; and
// every tensor's pieces tile it exactly (sharding/coverage.h: no element stored twice, none
// missing), so every reader of a validated manifest can rely on exact coverage.
absl::Status ValidateManifest(const pb::Manifest& manifest);

// ValidateManifest in parts, for a manifest whose pieces are never all in memory at once (a
// commit streaming them into the file): Start with the manifest's head (its format version,
// checksum block size, tensors and data files; its pieces are ignored), AddPiece for each
// piece in manifest order, then Finish for the checks across pieces (no shared bytes, exact
// coverage of each tensor). ValidateManifest is exactly this over a whole manifest: the same
// checks, in the same order, with the same messages. Keeps per piece only its tensor, file,
// byte range and region. `head` must outlive the validator; call each step once per piece,
// and none after an error.
class ManifestValidator {
 public:
  absl::Status Start(const pb::Manifest& head);
  // Start for a share of a manifest (ValidateManifestShare): its pieces are in it, whatever
  // its format version (1 or 2, the checkpoint's), and it lists no piece files.
  absl::Status StartShare(const pb::Manifest& share);
  // Room for `num_pieces` pieces (an optimization).
  void Reserve(int num_pieces);
  absl::Status AddPiece(const pb::StoredPiece& piece);
  absl::Status Finish();
  // Finish for a share: no two pieces share bytes, but the pieces need not tile any tensor
  // (nor add up to piece files' counts: a share lists none).
  absl::Status FinishWithoutCoverage();

 private:
  absl::Status CollectHead();
  absl::Status CollectTensors();
  absl::Status CollectFiles();
  absl::Status CheckPieceCounts() const;
  absl::Status CheckPiece(int i, const pb::StoredPiece& p, int* tensor, Region* region,
                          int* file_index) const;
  absl::Status CheckByteRangesDisjoint();
  std::string Describe(int i, const Region& region) const;

  const pb::Manifest* head_ = nullptr;
  absl::flat_hash_map<absl::string_view, int> tensor_index_;  // key -> index in head's tensors
  std::vector<DType> dtypes_;                                 // by tensor index
  absl::flat_hash_map<absl::string_view, int> file_index_;    // name -> index in head's files
  // Per piece added: its tensor, file and region, and (file, begin, end, piece) of its bytes.
  std::vector<int> tensor_of_;
  std::vector<int> file_of_;
  std::vector<Region> regions_;
  std::vector<std::tuple<int, int64_t, int64_t, int>> ranges_;
  absl::flat_hash_set<std::string> empty_pieces_;  // entry names of pieces without elements
};

// Validates a share of a manifest: a manifest holding only some of a checkpoint's pieces (those
// one load needs, in any order, not at their indices in the checkpoint's manifest) with their
// tensors and data files. ValidateManifest's checks of the head and of each piece on its own,
// and no two pieces sharing bytes (ManifestValidator: StartShare, AddPiece each piece,
// FinishWithoutCoverage); not that the pieces tile each tensor. The format version is 1 or 2
// and no piece files are listed (a share carries its pieces). DataLoss naming the piece (by its
// index in the share) or Unimplemented for an unknown format version.
absl::Status ValidateManifestShare(const pb::Manifest& share);

// 128 bits of XXH3 over everything ValidateManifest checks except each piece's own checksum
// values: the format version, the checksum block size, the tensors and data files, and each
// piece's key, region, file, byte range, entry name, writer and number of block checksums, in
// manifest order (not the step, time, metadata or saved layout). Two manifests with the same
// shape whose pieces each pass CheckPieceChecksums are valid or invalid together, so a writer
// that validated one may skip ValidateManifest for the next (e.g. a repeat save of an
// unchanged layout). Any field ValidateManifest reads must be hashed here. A digest compared
// within one process, never stored.
struct ManifestShape {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const ManifestShape& o) const { return low == o.low && high == o.high; }
  bool operator!=(const ManifestShape& o) const { return !(*this == o); }
};
ManifestShape ManifestShapeOf(const pb::Manifest& manifest);

// ManifestShapeOf in parts, for pieces streamed one at a time: Add each piece in manifest
// order, then Of(head) gives the shape of `head` (its pieces ignored) with these pieces.
class PieceShapeHasher {
 public:
  PieceShapeHasher();
  ~PieceShapeHasher();
  PieceShapeHasher(const PieceShapeHasher&) = delete;
  PieceShapeHasher& operator=(const PieceShapeHasher&) = delete;

  void Add(const pb::StoredPiece& piece);
  // Call once, after the last Add.
  ManifestShape Of(const pb::Manifest& head);

 private:
  struct State;
  std::unique_ptr<State> state_;
  int64_t count_ = 0;
};

// What ValidateManifest checks of piece i that ManifestShapeOf leaves out: its block
// checksums, when it has any, combine to its checksum. DataLoss naming the piece.
absl::Status CheckPieceChecksums(const pb::Manifest& manifest, int i);
// The same for a piece streamed on its own, `i` its index in the manifest (for the message).
absl::Status CheckStoredPieceChecksums(int i, const pb::StoredPiece& piece);
// Piece i's compression fields: all zero without a codec; with one, a known codec, a chunk size
// the decoder accepts and a stored length that can hold the frame's index.
absl::Status CheckPieceCodec(int i, const pb::StoredPiece& piece);

// The format checks of ParseManifestHead on an already parsed `head` that held `own_pieces`
// pieces itself (a streaming reader parses the head without its pieces and counts them).
// DataLoss (Unimplemented for an unknown version) naming `path`.
absl::Status CheckManifestHead(const pb::Manifest& head, int64_t own_pieces,
                               absl::string_view path);

// Parses manifest.pb bytes read from `path` (named in errors) and checks only its format: a
// known version; format 1 lists no piece files; format 2 lists valid piece-file records (as
// ValidateManifest checks them) and holds no pieces itself. DataLoss (Unimplemented for an
// unknown version) naming the path. The rest is for ValidateManifest once the pieces are in.
absl::StatusOr<pb::Manifest> ParseManifestHead(absl::string_view bytes, absl::string_view path);

// Parses (then validates) the bytes of a self-contained (format 1) manifest read from `path`
// (named in errors). A format-2 manifest needs its piece files: FailedPrecondition (read it
// with ReadManifestFile, storage/manifest_file.h).
absl::StatusOr<pb::Manifest> ParseManifest(absl::string_view bytes, absl::string_view path);

// Deterministic serialization.
std::string SerializeManifest(const pb::Manifest& manifest);

// Lookups over a validated manifest, built once in linear time (the manifest must outlive it):
// each tensor by key, each piece's tensor, the pieces of each data file.
class ManifestIndex {
 public:
  explicit ManifestIndex(const pb::Manifest& manifest);
  const pb::Manifest& manifest() const { return manifest_; }
  // Index of tensor `key` in manifest().tensors(), or -1.
  int TensorIndex(absl::string_view key) const;
  // Index of piece i's tensor (every piece's tensor is listed in a validated manifest).
  int TensorOfPiece(int piece) const { return tensor_of_piece_[piece]; }
  // The dtype of piece i's tensor.
  DType DTypeOfPiece(int piece) const { return dtypes_[tensor_of_piece_[piece]]; }
  // Indices of the pieces stored in data file `name`, in manifest order.
  absl::Span<const int> PiecesInFile(absl::string_view name) const;

 private:
  const pb::Manifest& manifest_;
  absl::flat_hash_map<absl::string_view, int> tensor_index_;
  std::vector<DType> dtypes_;
  std::vector<int> tensor_of_piece_;
  absl::flat_hash_map<absl::string_view, std::vector<int>> pieces_by_file_;
};

// Checks one data file's parsed header against a validated manifest: same data start and size,
// exactly one entry per piece in that file with matching name, dtype, shape and offsets, and no
// entries the manifest does not know. Linear in the file's entries.
absl::Status CheckHeaderAgainstManifest(const ManifestIndex& index, const pb::DataFile& file,
                                        const SafetensorsHeader& header);
// The same for a single file (builds the index: linear in the whole manifest).
absl::Status CheckHeaderAgainstManifest(const pb::Manifest& manifest, const pb::DataFile& file,
                                        const SafetensorsHeader& header);
// CheckHeaderAgainstManifest for a data file of a share (ValidateManifestShare), which knows
// only some of the file's entries: same data start and size, and each of the share's pieces in
// that file an entry with matching name, dtype, shape and offsets; other entries are allowed.
absl::Status CheckHeaderAgainstShare(const ManifestIndex& index, const pb::DataFile& file,
                                     const SafetensorsHeader& header);

// The check behind both: data file `file`'s parsed header against `pieces`, the (validated)
// pieces stored in it, `dtypes[i]` the dtype of pieces[i]'s tensor; with `all_entries_known`,
// the header may hold no other entry. For pieces no ManifestIndex covers (streamed ones).
absl::Status CheckHeaderAgainstPieces(const pb::DataFile& file, const SafetensorsHeader& header,
                                      absl::Span<const pb::StoredPiece* const> pieces,
                                      absl::Span<const DType> dtypes, bool all_entries_known);

// "key [0:4, 8:16] in data/r0_0.safetensors" for error messages.
std::string DescribePiece(const pb::StoredPiece& piece);

}  // namespace ckpt

#endif  // CKPT_STORAGE_MANIFEST_CODEC_H_
