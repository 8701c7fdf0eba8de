// A data file written from bytes that arrive in chunks: its layout (safetensors header, each
// piece's offset) is fixed when it is created, and each piece's bytes are then appended in
// order, a chunk at a time, hashed as they pass and written at their place in the file. Pieces
// may be filled in any order (chunks of different pieces may interleave). Finish checks that
// every byte arrived, fsyncs the file and returns the same manifest records (file, pieces,
// XXH3-64 checksums and block hashes) that WriteDataFiles (storage/checkpoint_writer.h)
// produces for the same plan; the file's bytes are identical too.
//
// The data section (the pieces back to back, after the header, which is padded to a multiple of
// 4096 bytes) may instead arrive in file order through AppendData, chunks that may span
// pieces; with `direct_io` such runs are written with O_DIRECT where they are aligned (address,
// offset and length multiples of 4096: the staged chunks of a host buffer pool), the rest (the
// last partial block, Append) buffered. A filesystem that refuses O_DIRECT (EINVAL at open or at
// the first write) gets buffered writes instead, and io_mode() says so. One fsync at Finish.
//
// The file is created in a staging directory (CreateStagingDir) under its final name inside
// it; nothing is renamed into place here: the checkpoint's commit (CommitCheckpoint) does that.
// No threads, no logging; every error names the file (and the tensor where one is concerned).
#ifndef CKPT_STORAGE_DATA_FILE_STREAM_H_
#define CKPT_STORAGE_DATA_FILE_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/checkpoint_writer.h"
#include "storage/checksum.h"

namespace ckpt {

// How a DataFileStream writes.
struct DataFileStreamOptions {
  int64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  bool direct_io = false;  // O_DIRECT for aligned AppendData runs, where the filesystem allows
};

// See the file comment. Not thread-safe: one writer appends.
class DataFileStream {
 public:
  // Create with options (see DataFileStreamOptions).
  static absl::StatusOr<std::unique_ptr<DataFileStream>> Create(
      const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
      const DataFilePlan& plan, int index, const DataFileStreamOptions& options);

  // Lays out `plan` (pieces' `data` is ignored and may be null) as data file `index` of its
  // writer rank, creates <staging_dir>/data/r<rank>_<index>.safetensors and writes its header.
  // Pieces are validated as WriteDataFiles validates them.
  static absl::StatusOr<std::unique_ptr<DataFileStream>> Create(
      const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
      const DataFilePlan& plan, int index,
      int64_t checksum_block_bytes = kDefaultChecksumBlockBytes);

  DataFileStream(const DataFileStream&) = delete;
  DataFileStream& operator=(const DataFileStream&) = delete;
  ~DataFileStream();  // closes the file (an unfinished one stays for DiscardStagingDir)

  const std::string& path() const { return path_; }
  int num_pieces() const { return static_cast<int>(pieces_.size()); }
  // Bytes of piece `piece` still to come.
  int64_t piece_bytes_left(int piece) const;
  // Piece bytes written so far (the header not counted).
  int64_t bytes_written() const { return bytes_written_; }

  // Writes the next `bytes` bytes of piece `piece` (0 <= piece < num_pieces()) at their place
  // and hashes them. More bytes than the piece has left is InvalidArgument naming the tensor and
  // the file; a failed write names the file and the errno (and the stream takes no more bytes).
  absl::Status Append(int piece, const void* data, int64_t bytes);

  // Writes the next `bytes` bytes of the data section (the pieces in plan order, back to
  // back), hashing each piece's share. A piece filled partly by Append and partly by AppendData
  // is FailedPrecondition; more bytes than the section has left is InvalidArgument.
  absl::Status AppendData(const void* data, int64_t bytes);

  // How the bytes were written so far: "O_DIRECT" (every AppendData run aligned went direct),
  // "buffered" (direct_io not asked for) or "buffered (O_DIRECT refused)".
  const char* io_mode() const;
  bool direct_io_refused() const { return direct_refused_; }
  int64_t direct_bytes() const { return direct_bytes_; }

  // Every piece complete (FailedPrecondition naming the first one that is not): fsyncs and
  // closes the file and returns its manifest records with the checksums.
  absl::StatusOr<WrittenData> Finish();

 private:
  struct Piece {
    std::string key;
    int64_t file_offset = 0;  // where its bytes start in the file
    int64_t size = 0;
    int64_t done = 0;
    std::unique_ptr<StreamingChecksum> checksum;  // while its bytes are arriving
  };
  DataFileStream(std::string path, int fd, DataFileLayout layout, int64_t checksum_block_bytes);
  absl::Status WriteAt(int64_t offset, const char* data, int64_t bytes);
  // Writes the aligned prefix of a run with O_DIRECT (when open), the rest with WriteAt.
  absl::Status WriteRun(int64_t offset, const char* data, int64_t bytes);
  // Feeds `bytes` more bytes of piece `piece` to its checksum.
  void Hash(int piece, const void* data, int64_t bytes);
  void Close();

  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;  // the same file opened with O_DIRECT (-1: not asked for, or refused)
  bool direct_asked_ = false;
  bool direct_refused_ = false;
  int64_t direct_bytes_ = 0;
  int64_t data_start_ = 0;  // the header's size: where the data section begins
  int64_t data_bytes_ = 0;  // the data section's size
  int64_t data_pos_ = 0;    // AppendData's position in it
  int next_piece_ = 0;      // the piece AppendData's position is in
  DataFileLayout layout_;   // records; checksums filled as pieces complete
  int64_t checksum_block_bytes_;
  std::vector<Piece> pieces_;
  int64_t bytes_written_ = 0;
  absl::Status failed_;  // the first write error; the stream refuses more bytes after it
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_DATA_FILE_STREAM_H_
