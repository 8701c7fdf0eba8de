// A data file written from bytes that arrive in chunks: its layout (safetensors header, each
// piece's offset) is fixed when it is created, and each piece's bytes are then appended in
// order, a chunk at a time, hashed as they pass and written at their place in the file. Pieces
// may be filled in any order (chunks of different pieces may interleave). Finish checks that
// every byte arrived, fsyncs the file and returns the same manifest records (file, pieces,
// XXH3-64 checksums and block hashes) that WriteDataFiles (storage/checkpoint_writer.h)
// produces for the same plan; the file's bytes are identical too.
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

// See the file comment. Not thread-safe: one writer appends.
class DataFileStream {
 public:
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
  void Close();

  std::string path_;
  int fd_ = -1;
  DataFileLayout layout_;  // records; checksums filled as pieces complete
  int64_t checksum_block_bytes_;
  std::vector<Piece> pieces_;
  int64_t bytes_written_ = 0;
  absl::Status failed_;  // the first write error; the stream refuses more bytes after it
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_DATA_FILE_STREAM_H_
