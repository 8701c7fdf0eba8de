// A checkpoint manifest's files: writing a manifest without holding its bytes (its
// deterministic serialization is streamed through a small buffer into the file, which is then
// fsynced; a manifest of millions of pieces is never one string) and reading it back.
//
// A manifest that fits in one protobuf message is manifest.pb alone (format 1: exactly
// SerializeManifest's bytes). A larger one (format 2) keeps its pieces, in order, in piece
// files beside manifest.pb (ManifestPieceFileName: manifest-pieces-00000.pb, ...), each a
// pb::ManifestPieces of at most a byte budget; manifest.pb then lists them (name, size,
// XXH3-64, piece count) and holds no pieces. The piece files are written and fsynced before
// manifest.pb, which stays the checkpoint's single commit point.
#ifndef CKPT_STORAGE_MANIFEST_FILE_H_
#define CKPT_STORAGE_MANIFEST_FILE_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/manifest.pb.h"
#include "storage/manifest_codec.h"

namespace ckpt {

// The name of a checkpoint's manifest inside its directory.
inline constexpr char kManifestFileName[] = "manifest.pb";

// Default byte budget of one manifest piece file.
inline constexpr int64_t kDefaultManifestPieceFileBytes = int64_t{1} << 30;

// How a manifest is laid out in files.
struct ManifestFileOptions {
  // A manifest whose serialization is at most this many bytes is written as one file (format
  // 1); a larger one in piece files (format 2). Default: the most protobuf parses.
  int64_t max_single_file_bytes = kMaxManifestBytes - 1;
  // Piece files take pieces until the next would take them past this many bytes (a piece is
  // never split: one larger than the budget is alone in its file).
  int64_t piece_file_bytes = kDefaultManifestPieceFileBytes;
};

// Receives one piece of a manifest being written; an error ends the write.
using ManifestPieceSink = absl::FunctionRef<absl::Status(const pb::StoredPiece&)>;
// Hands a manifest's pieces, in manifest order, to the sink; returns the sink's first error or
// its own.
using ManifestPieceSource = absl::FunctionRef<absl::Status(ManifestPieceSink sink)>;

// The bytes `piece` adds to a manifest's serialization (or to a piece file): its field tag,
// length and message.
int64_t PieceRecordBytes(const pb::StoredPiece& piece);

// Writes a manifest into checkpoint directory `dir`: `manifest_name` (e.g. manifest.pb.tmp,
// for the caller to rename) and, when the manifest is larger than
// options.max_single_file_bytes, its piece files (written and fsynced, and `dir` fsynced, before
// `manifest_name` is created). `head` is the manifest without its pieces (its own pieces,
// format version and piece files are ignored: the format is chosen here); `source` hands the
// pieces, which must add up to `pieces_bytes` (PieceRecordBytes each; Internal otherwise).
// ResourceExhausted when the manifest needs more than kMaxManifestPieceFiles piece files or
// its head alone is too large for one file. Errors name the file; on error the files written
// here are removed.
absl::Status WriteManifestFiles(const std::string& dir, const std::string& manifest_name,
                                const pb::Manifest& head, int64_t pieces_bytes,
                                ManifestPieceSource source, const ManifestFileOptions& options);

// WriteManifestFiles of a whole manifest (its pieces included).
absl::Status WriteManifestFiles(const std::string& dir, const std::string& manifest_name,
                                const pb::Manifest& manifest, const ManifestFileOptions& options);

// Receives one piece of a manifest being read, with its index in manifest order; it may move
// from the piece. An error ends the read.
using ManifestPieceVisitor = absl::FunctionRef<absl::Status(int64_t index, pb::StoredPiece& piece)>;

// Reads the manifest of the checkpoint in `checkpoint_dir` in bounded memory: hands every piece,
// in manifest order, to `visit` (streamed from manifest.pb for format 1, from its piece files for
// format 2, a bounded buffer at a time: never the whole file in memory), validating exactly what
// ReadManifestFile validates (ManifestValidator: Start with the head, AddPiece as each piece comes,
// Finish at the end; each piece file's size, XXH3-64 and piece count against its record), and
// returns the head (the manifest without pieces: tensors, files, metadata, piece-file records).
// Errors are ReadManifestFile's, with the same codes and naming the same files. The visitor may
// have seen pieces of a manifest that then fails: on error the caller discards what it built.
// Format 1 is read in two passes (the head, whose data files serialize after the pieces, then
// the pieces). A piece file that does not parse or whose pieces do not validate is first
// checked against its checksum (read to its end), so corruption is reported as such. Of a
// manifest with several faults, the one reported may differ from a whole-file read's (pieces
// are validated as they come, before later piece files are read).
absl::StatusOr<pb::Manifest> StreamManifestFile(const std::string& checkpoint_dir,
                                                ManifestPieceVisitor visit);

// Receives a manifest's head (no pieces), checked for its format, tensors and data files, before
// any of its pieces; it may not keep the reference past the read. An error ends the read.
using ManifestHeadVisitor = absl::FunctionRef<absl::Status(const pb::Manifest& head)>;

// StreamManifestFile that hands the head to `on_head` first, for readers that need the tensors
// and data files to take in the pieces (one read of the manifest, not a head read before it).
absl::StatusOr<pb::Manifest> StreamManifestFile(const std::string& checkpoint_dir,
                                                ManifestHeadVisitor on_head,
                                                ManifestPieceVisitor visit);

// StreamManifestFile's reading of a self-contained (format 1) manifest from `bytes` in memory,
// `path` naming them in errors: the same two passes and checks, with ParseManifest's errors
// (DataLoss larger than 2 GiB; FailedPrecondition for a format-2 manifest, which needs its
// piece files). For tests and the manifest fuzz target.
absl::StatusOr<pb::Manifest> StreamManifestBytes(absl::string_view bytes, absl::string_view path,
                                                 ManifestPieceVisitor visit);

// Reads the manifest of the checkpoint in `checkpoint_dir` with all its pieces in memory:
// StreamManifestFile appending each piece, in order, to the head it returns. A format-2
// manifest keeps its version and piece-file records (with its pieces now in memory). NotFound
// naming a missing file; DataLoss naming a file whose bytes do not match its record or do not
// parse, or a manifest that does not validate (ValidateManifest).
absl::StatusOr<pb::Manifest> ReadManifestFile(const std::string& checkpoint_dir);

// Reads and checks manifest.pb of `checkpoint_dir` only, in bounded memory: its tensors,
// metadata and piece-file records, never its pieces (a format-1 manifest's are skipped
// unparsed), checked only for its format (CheckManifestHead; DataLoss when its bytes are not a
// valid protobuf message). For views that list tensors.
absl::StatusOr<pb::Manifest> ReadManifestHead(const std::string& checkpoint_dir);

// Creates (or truncates) `path`, writes SerializeManifest(manifest) into it through a bounded
// buffer, fsyncs and closes it. Errors name the path; on error the file may be partial (the
// caller writes a temporary name and renames it only after success). One file whatever the
// size: checkpoints are written with WriteManifestFiles.
absl::Status WriteManifestDurably(const std::string& path, const pb::Manifest& manifest);

// Writes a manifest's bytes, in parts, into a coded stream set to serialize deterministically
// (e.g. the fields before the pieces, the pieces a few at a time, the fields after them: a
// message's bytes are its fields' bytes in field-number order). An error ends the write.
using ManifestSerializer =
    absl::FunctionRef<absl::Status(google::protobuf::io::CodedOutputStream* out)>;

// WriteManifestDurably with the bytes `serialize` writes; its error is returned (the file is
// then partial).
absl::Status WriteManifestDurably(const std::string& path, ManifestSerializer serialize);

}  // namespace ckpt

#endif  // CKPT_STORAGE_MANIFEST_FILE_H_
