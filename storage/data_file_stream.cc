#include "storage/data_file_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/file_util.h"
#include "storage/io_lane.h"

namespace ckpt {

namespace {
constexpr int64_t kDirectAlign = 4096;
}  // namespace

absl::StatusOr<std::unique_ptr<DataFileStream>> DataFileStream::Create(
    const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
    const DataFilePlan& plan, int index, int64_t checksum_block_bytes) {
  DataFileStreamOptions options;
  options.checksum_block_bytes = checksum_block_bytes;
  return Create(staging_dir, tensors, plan, index, options);
}

absl::StatusOr<std::unique_ptr<DataFileStream>> DataFileStream::Create(
    const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
    const DataFilePlan& plan, int index, const DataFileStreamOptions& options) {
  const int64_t checksum_block_bytes = options.checksum_block_bytes;
  CKPT_ASSIGN_OR_RETURN(DataFileLayout layout,
                        LayOutDataFile(tensors, plan, index, /*require_data=*/false));
  const std::string path = JoinPath(staging_dir, layout.name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  std::unique_ptr<DataFileStream> stream(
      new DataFileStream(path, fd, std::move(layout), checksum_block_bytes));
  const std::string& header = stream->layout_.header;
  CKPT_RETURN_IF_ERROR(stream->WriteAt(0, header.data(), static_cast<int64_t>(header.size())));
  if (options.direct_io) {
    stream->direct_asked_ = true;
    stream->direct_fd_ = io_internal::OpenFile(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (stream->direct_fd_ < 0) {
      if (errno != EINVAL) return ErrnoStatus(errno, absl::StrCat("open ", path, " O_DIRECT"));
      stream->direct_refused_ = true;  // e.g. tmpfs: buffered writes instead
    }
  }
  return stream;
}

DataFileStream::DataFileStream(std::string path, int fd, DataFileLayout layout,
                               int64_t checksum_block_bytes)
    : path_(std::move(path)),
      fd_(fd),
      layout_(std::move(layout)),
      checksum_block_bytes_(checksum_block_bytes) {
  data_start_ = static_cast<int64_t>(layout_.header.size());
  for (pb::StoredPiece& sp : layout_.records.pieces) {
    data_bytes_ += sp.byte_length();
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
  if (direct_fd_ >= 0) ::close(direct_fd_);
  fd_ = -1;
  direct_fd_ = -1;
}

const char* DataFileStream::io_mode() const {
  if (direct_refused_) return "buffered (O_DIRECT refused)";
  return direct_asked_ ? "O_DIRECT" : "buffered";
}

absl::Status DataFileStream::WriteRun(int64_t offset, const char* data, int64_t bytes) {
  const int64_t direct = bytes / kDirectAlign * kDirectAlign;
  if (direct_fd_ >= 0 && direct > 0 && offset % kDirectAlign == 0 &&
      reinterpret_cast<uintptr_t>(data) % kDirectAlign == 0) {
    ssize_t n;
    do {
      n = ::pwrite(direct_fd_, data, static_cast<size_t>(direct), offset);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EINVAL && direct_bytes_ == 0) {
      // Refused at the first write (some filesystems open with O_DIRECT but refuse the I/O).
      ::close(direct_fd_);
      direct_fd_ = -1;
      direct_refused_ = true;
      return WriteAt(offset, data, bytes);
    }
    if (n < 0) {
      failed_ = ErrnoStatus(errno, absl::StrCat("O_DIRECT write of ", direct, " bytes at offset ",
                                                offset, " of ", path_));
      return failed_;
    }
    direct_bytes_ += n;  // a short write's rest goes buffered
    return WriteAt(offset + n, data + n, bytes - n);
  }
  return WriteAt(offset, data, bytes);
}

void DataFileStream::Hash(int piece, const void* data, int64_t bytes) {
  Piece& p = pieces_[piece];
  if (!p.checksum) p.checksum = std::make_unique<StreamingChecksum>(checksum_block_bytes_);
  p.checksum->Update(data, static_cast<size_t>(bytes));
  p.done += bytes;
  bytes_written_ += bytes;
  if (p.done == p.size) {
    SetStoredChecksums(p.checksum->Whole(), p.checksum->Blocks(), checksum_block_bytes_,
                       &layout_.records.pieces[piece]);
    p.checksum.reset();
  }
}

absl::Status DataFileStream::AppendData(const void* data, int64_t bytes) {
  if (!failed_.ok()) return failed_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  if (bytes < 0 || bytes > data_bytes_ - data_pos_) {
    return absl::InvalidArgumentError(absl::StrCat(bytes, " more bytes for the data section of ",
                                                   path_, " (", data_bytes_, " bytes, ", data_pos_,
                                                   " written)"));
  }
  // Check first that every piece the run touches was filled by AppendData only.
  const char* in = static_cast<const char*>(data);
  int64_t pos = data_start_ + data_pos_;
  const int64_t end = pos + bytes;
  for (int i = next_piece_; i < num_pieces() && pos < end; ++i) {
    const Piece& p = pieces_[i];
    if (p.file_offset + p.size <= pos) continue;
    if (p.file_offset + p.done != pos) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", p.key, ": data section bytes arrived out of order in ", path_));
    }
    pos += std::min(end - pos, p.size - p.done);
  }
  CKPT_RETURN_IF_ERROR(WriteRun(data_start_ + data_pos_, in, bytes));
  pos = data_start_ + data_pos_;
  while (pos < end) {
    const Piece& p = pieces_[next_piece_];
    if (p.file_offset + p.size <= pos) {
      ++next_piece_;
      continue;
    }
    const int64_t n = std::min(end - pos, p.size - p.done);
    Hash(next_piece_, in + (pos - data_start_ - data_pos_), n);
    pos += n;
  }
  data_pos_ += bytes;
  return absl::OkStatus();
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
  Hash(piece, data, bytes);
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
