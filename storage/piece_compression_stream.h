// A data file of compressed pieces (storage/piece_codec.h) written as their encoded chunks
// arrive, for a pipelined save (worker/save_write_pipeline.h): the writer encodes a run of a
// piece's raw bytes, chunk by chunk, and hands the encoded chunks here; this writes them at
// the piece's place, hashes the stored bytes as they pass (the raw bytes' hashes come with the
// chunks, computed while encoding) and, once the piece's last chunk arrived, writes its frame
// header and index in front of its chunks. Every byte is hashed once; nothing is read back.
//
// The file is the one WriteDataFiles (WriteOptions.compression) writes for the same plan, with
// the same frames, stored and raw checksums and manifest fields: a safetensors file whose
// compressed pieces are uint8 entries holding their frames. Two differences a reader never
// sees: the stored sizes are unknown until the pieces are encoded, so the header (written
// last, at Finish) is padded with spaces to the size reserved for the largest frames the
// pieces can take, and the frames lie in the order the pieces arrived in (the manifest's
// offsets and the header say where). Empty pieces are stored raw, at the end.
//
// Writes are buffered (the encoded chunks are not block-aligned), each run's writeback started
// at once (sync_file_range), so the disk writes while the next run is encoded; one fsync at
// Finish. Not thread-safe: one writer. No threads, no logging; errors name the file and tensor.
#ifndef CKPT_STORAGE_PIECE_COMPRESSION_STREAM_H_
#define CKPT_STORAGE_PIECE_COMPRESSION_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint_writer.h"
#include "storage/checksum.h"
#include "storage/piece_codec.h"
#include "storage/safetensors.h"

namespace ckpt {

// See the file comment.
class CompressedFileStream {
 public:
  // Lays out `plan` (pieces' `data` ignored) as data file `index` of its writer rank, validated
  // as WriteDataFiles validates it, and creates <staging_dir>/data/r<rank>_<index>.safetensors.
  // InvalidArgument for bad options (ParseCompression's) or pieces.
  static absl::StatusOr<std::unique_ptr<CompressedFileStream>> Create(
      const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
      const DataFilePlan& plan, int index, const CompressionOptions& options,
      int64_t checksum_block_bytes = kDefaultChecksumBlockBytes);

  CompressedFileStream(const CompressedFileStream&) = delete;
  CompressedFileStream& operator=(const CompressedFileStream&) = delete;
  ~CompressedFileStream();  // closes the file (an unfinished one stays for DiscardStagingDir)

  const std::string& path() const { return path_; }
  int num_pieces() const { return static_cast<int>(pieces_.size()); }
  // How piece `piece` is encoded (its codec, element width, chunk size and level).
  const CodecParams& params(int piece) const { return pieces_[piece].params; }
  int64_t piece_bytes(int piece) const { return pieces_[piece].raw_size; }

  // The next `n` encoded chunks of piece `piece`, in order: their raw bytes continue where the
  // piece's last append ended; every chunk but the piece's last holds params().chunk_bytes raw
  // bytes. A piece, once begun, is completed before another begins. More raw bytes than the
  // piece has, a chunk of the wrong raw size, or another piece begun while one is open is
  // FailedPrecondition naming the tensor and the file; a failed write names the file and the
  // errno (and the stream takes no more).
  absl::Status AppendEncoded(int piece, const EncodedChunk* chunks, size_t n);

  int64_t raw_bytes_appended() const { return raw_appended_; }
  int64_t stored_bytes_written() const { return pos_; }

  // Every piece complete (FailedPrecondition naming the first one that is not): writes the
  // header, truncates the file to its size, fsyncs and closes it, and returns the manifest
  // records of the file and its pieces, checksums set.
  absl::StatusOr<WrittenData> Finish();

 private:
  struct Piece {
    std::string key;
    CodecParams params;
    int64_t raw_size = 0;
    int64_t raw_done = 0;
    int64_t frame_start = -1;  // in the data section; -1: not begun
    int64_t frame_bytes = 0;   // the frame's size once complete
  };
  // The piece being appended: its index entries and the stored checksum's state.
  struct Open {
    int piece = -1;
    int64_t head_bytes = 0;  // FrameIndexBytes
    int64_t prefix_end = 0;  // frame offset where the streamed checksum starts (block-aligned)
    int64_t frame_pos = 0;   // frame offset of the next stored byte
    std::vector<FrameEntry> entries;
    std::string retained;  // stored bytes in [head_bytes, prefix_end) of runs before the last
    std::unique_ptr<StreamingChecksum> tail;  // blocks from prefix_end on
  };

  CompressedFileStream(std::string path, int fd, int64_t header_bytes, WrittenData records,
                       std::vector<Piece> pieces, int64_t checksum_block_bytes);
  absl::Status Begin(int piece);
  absl::Status CheckChunks(const Piece& p, const EncodedChunk* chunks, size_t n) const;
  absl::Status WriteChunks(const EncodedChunk* chunks, size_t n);
  // Hashes the stored bytes of `chunks`; the parts in the checksum's prefix go to `deferred`
  // (the piece completes with these chunks) or are copied into open_.retained.
  void HashChunks(const EncodedChunk* chunks, size_t n, bool completes,
                  std::vector<absl::string_view>* deferred);
  absl::Status Complete(const std::vector<absl::string_view>& deferred);
  absl::Status WriteAt(int64_t offset, const char* data, int64_t bytes);
  absl::StatusOr<std::string> FinalHeader();
  void Close();

  std::string path_;
  int fd_ = -1;
  const int64_t header_bytes_;  // reserved: where the data section begins
  WrittenData records_;         // laid out raw; offsets, codec fields and checksums set later
  std::vector<SafetensorsEntry> raw_entries_;  // name, dtype and shape of each piece
  int writer_rank_ = 0;
  std::vector<Piece> pieces_;
  const int64_t checksum_block_bytes_;
  int64_t pos_ = 0;  // the data section's bytes so far
  int64_t raw_appended_ = 0;
  Open open_;
  absl::Status failed_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_PIECE_COMPRESSION_STREAM_H_
