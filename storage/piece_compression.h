// The shell around the piece codec (storage/piece_codec.h) for writers: encodes pieces with
// threads over their chunks, and a save's data file plans into frames, which WriteDataFiles
// (with WriteOptions.compression) lays out and writes as uint8 entries with the codec fields in
// their manifest records.
#ifndef CKPT_STORAGE_PIECE_COMPRESSION_H_
#define CKPT_STORAGE_PIECE_COMPRESSION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "sharding/tensor_meta.h"
#include "storage/checkpoint_writer.h"
#include "storage/piece_codec.h"

namespace ckpt {

// Encodes `n` raw bytes of `dtype` (the codec CodecForDType picks) on `options.threads` threads
// (0: one per CPU), one chunk per task. InvalidArgument for bad options.
absl::StatusOr<PackedPiece> EncodePieceParallel(const void* raw, int64_t n, DType dtype,
                                                const CompressionOptions& options);

// Decodes the whole frame of `expect` into `dest` on `threads` threads (0: one per CPU).
absl::Status DecodePieceParallel(absl::string_view frame, const FrameExpect& expect, void* dest,
                                 bool verify, int threads, absl::string_view what);

// Sets a manifest record's codec fields from `packed` (stored_length is the frame's size).
void SetPackedFields(const PackedPiece& packed, pb::StoredPiece* piece);

// The frames of one data file's pieces, in plan order; a piece whose codec is kNone (empty, or
// without data) is written raw.
using PackedPieces = std::vector<PackedPiece>;
inline bool IsPacked(const PackedPieces* packed, size_t i) {
  return packed != nullptr && (*packed)[i].codec != PieceCodec::kNone;
}

// Every non-empty piece of `files` encoded, per file. Unknown tensors are InvalidArgument (as
// WriteDataFiles says).
absl::StatusOr<std::vector<PackedPieces>> CompressPieces(const std::vector<TensorMeta>& tensors,
                                                         const std::vector<DataFilePlan>& files,
                                                         const CompressionOptions& options);

}  // namespace ckpt

#endif  // CKPT_STORAGE_PIECE_COMPRESSION_H_
