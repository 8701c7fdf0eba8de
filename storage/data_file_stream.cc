#include "storage/data_file_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/file_util.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<DataFileStream>> DataFileStream::Create(
    const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
    const DataFilePlan& plan, int index, int64_t checksum_block_bytes) {
  CKPT_ASSIGN_OR_RETURN(DataFileLayout layout,
                        LayOutDataFile(tensors, plan, index, /*require_data=*/false));
  const std::string path = JoinPath(staging_dir, layout.name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  std::unique_ptr<DataFileStream> stream(
      new DataFileStream(path, fd, std::move(layout), checksum_block_bytes));
  const std::string& header = stream->layout_.header;
  CKPT_RETURN_IF_ERROR(stream->WriteAt(0, header.data(), static_cast<int64_t>(header.size())));
  return stream;
}

DataFileStream::DataFileStream(std::string path, int fd, DataFileLayout layout,
                               int64_t checksum_block_bytes)
    : path_(std::move(path)),
      fd_(fd),
      layout_(std::move(layout)),
      checksum_block_bytes_(checksum_block_bytes) {
  for (pb::StoredPiece& sp : layout_.records.pieces) {
    Piece p;
    p.key = sp.key();
    p.file_offset = sp.byte_offset();
    p.size = sp.byte_length();
    if (p.size == 0) {  // complete already: the checksum of no bytes
      StreamingChecksum empty(checksum_block_bytes_);
      SetStoredChecksums(empty.Whole(), empty.Blocks(), checksum_block_bytes_, &sp);
    }
    pieces_.push_back(std::move(p));
  }
}

DataFileStream::~DataFileStream() { Close(); }

void DataFileStream::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t DataFileStream::piece_bytes_left(int piece) const {
  return pieces_[piece].size - pieces_[piece].done;
}

absl::Status DataFileStream::WriteAt(int64_t offset, const char* data, int64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed_ = ErrnoStatus(n < 0 ? errno : EIO, absl::StrCat("write ", bytes, " bytes at offset ",
                                                              offset, " of ", path_));
      return failed_;
    }
    data += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status DataFileStream::Append(int piece, const void* data, int64_t bytes) {
  if (!failed_.ok()) return failed_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  if (piece < 0 || piece >= num_pieces()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, " has ", num_pieces(), " pieces, not piece ", piece));
  }
  Piece& p = pieces_[piece];
  if (bytes < 0 || bytes > p.size - p.done) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", p.key, ": ", bytes,
                                                   " more bytes for a piece of ", p.size,
                                                   " bytes with ", p.done, " written, in ", path_));
  }
  if (bytes == 0) return absl::OkStatus();
  CKPT_RETURN_IF_ERROR(WriteAt(p.file_offset + p.done, static_cast<const char*>(data), bytes));
  if (!p.checksum) p.checksum = std::make_unique<StreamingChecksum>(checksum_block_bytes_);
  p.checksum->Update(data, static_cast<size_t>(bytes));
  p.done += bytes;
  bytes_written_ += bytes;
  if (p.done == p.size) {
    SetStoredChecksums(p.checksum->Whole(), p.checksum->Blocks(), checksum_block_bytes_,
                       &layout_.records.pieces[piece]);
    p.checksum.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<WrittenData> DataFileStream::Finish() {
  if (!failed_.ok()) return failed_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  for (const Piece& p : pieces_) {
    if (p.done != p.size) {
      return absl::FailedPreconditionError(absl::StrCat("tensor ", p.key, ": ", p.done, " of ",
                                                        p.size, " bytes written to ", path_));
    }
  }
  failed_ = FsyncFd(fd_, path_);
  Close();
  if (!failed_.ok()) return failed_;
  return std::move(layout_.records);
}

}  // namespace ckpt
