#include "storage/piece_compression_stream.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

constexpr int64_t kHeaderAlignment = 4096;
// Digits an offset or size can gain in the final header over the reserved one, per entry: two
// offsets of up to 20 digits where the reserved header may have had one.
constexpr int64_t kHeaderSlackPerEntry = 40;

std::map<std::string, std::string> FileMetadata(int writer_rank, bool packed) {
  std::map<std::string, std::string> metadata = {{"format", "ckpt"},
                                                 {"writer_rank", absl::StrCat(writer_rank)},
                                                 {"ckpt_writer", kWriterVersion}};
  if (packed) metadata["ckpt_compression"] = kPackedEntriesNote;
  return metadata;
}

// The safetensors entries of a file's pieces: `raw[i]` (name, dtype, shape) for an empty one,
// at `empty_at`; a piece with a frame (stored[i] > 0 bytes at begin[i]) as uint8.
std::vector<SafetensorsEntry> Entries(const std::vector<SafetensorsEntry>& raw,
                                      const std::vector<int64_t>& begin,
                                      const std::vector<int64_t>& stored, int64_t empty_at) {
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (stored[i] > 0) {
      entries.push_back({raw[i].name, DType::kU8, {stored[i]}, begin[i], begin[i] + stored[i]});
    } else {
      entries.push_back({raw[i].name, raw[i].dtype, raw[i].shape, empty_at, empty_at});
    }
  }
  return entries;
}

// The header size reserved for a file of pieces `raw` (of raw_bytes[i] bytes, encoded with
// params[i]): its header with every frame at its largest, plus room for longer numbers, padded
// to the alignment.
absl::StatusOr<int64_t> ReservedHeaderBytes(const std::vector<SafetensorsEntry>& raw,
                                            const std::vector<int64_t>& raw_bytes,
                                            const std::vector<CodecParams>& params,
                                            int writer_rank) {
  std::vector<int64_t> begin(raw.size()), stored(raw.size());
  int64_t pos = 0;
  bool packed = false;
  for (size_t i = 0; i < raw.size(); ++i) {
    begin[i] = pos;
    stored[i] = raw_bytes[i] == 0 ? 0 : MaxFrameBytes(raw_bytes[i], params[i]);
    pos += stored[i];
    packed = packed || raw_bytes[i] > 0;
  }
  CKPT_ASSIGN_OR_RETURN(
      std::string header,
      EncodeSafetensorsHeader(Entries(raw, begin, stored, pos), FileMetadata(writer_rank, packed),
                              kHeaderAlignment));
  const int64_t wanted =
      static_cast<int64_t>(header.size()) + kHeaderSlackPerEntry * static_cast<int64_t>(raw.size());
  return (wanted + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CompressedFileStream>> CompressedFileStream::Create(
    const std::string& staging_dir, const std::vector<TensorMeta>& tensors,
    const DataFilePlan& plan, int index, const CompressionOptions& options,
    int64_t checksum_block_bytes) {
  if (checksum_block_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum block of ", checksum_block_bytes, " bytes for a compressed file"));
  }
  CKPT_ASSIGN_OR_RETURN(DataFileLayout layout,
                        LayOutDataFile(tensors, plan, index, /*require_data=*/false));
  std::map<std::string, DType> by_key;
  for (const TensorMeta& t : tensors) by_key.emplace(t.key, t.dtype);
  const size_t n = plan.pieces.size();
  std::vector<Piece> pieces(n);
  std::vector<SafetensorsEntry> raw(n);
  std::vector<int64_t> raw_bytes(n);
  std::vector<CodecParams> params(n);
  for (size_t i = 0; i < n; ++i) {
    const DType dtype = by_key.at(plan.pieces[i].key);  // LayOutDataFile checked the key
    raw[i] = {layout.records.pieces[i].entry_name(), dtype, EntryShape(plan.pieces[i].region), 0,
              0};
    Piece& p = pieces[i];
    p.key = plan.pieces[i].key;
    p.raw_size = raw_bytes[i] = layout.records.pieces[i].byte_length();
    p.params.codec = CodecForDType(dtype);
    p.params.element_width =
        p.params.codec == PieceCodec::kByteGroupZstd ? ElementWidthFor(dtype) : 1;
    p.params.chunk_bytes = options.chunk_bytes;
    p.params.level = options.level;
    CKPT_RETURN_IF_ERROR(ValidateCodecParams(p.params));
    params[i] = p.params;
  }
  CKPT_ASSIGN_OR_RETURN(int64_t header_bytes,
                        ReservedHeaderBytes(raw, raw_bytes, params, plan.writer_rank));
  const std::string path = JoinPath(staging_dir, layout.name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  std::unique_ptr<CompressedFileStream> stream(new CompressedFileStream(
      path, fd, header_bytes, std::move(layout.records), std::move(pieces), checksum_block_bytes));
  stream->raw_entries_ = std::move(raw);
  stream->writer_rank_ = plan.writer_rank;
  return stream;
}

CompressedFileStream::CompressedFileStream(std::string path, int fd, int64_t header_bytes,
                                           WrittenData records, std::vector<Piece> pieces,
                                           int64_t checksum_block_bytes)
    : path_(std::move(path)),
      fd_(fd),
      header_bytes_(header_bytes),
      records_(std::move(records)),
      pieces_(std::move(pieces)),
      checksum_block_bytes_(checksum_block_bytes) {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].raw_size > 0) continue;
    StreamingChecksum empty(checksum_block_bytes_);  // complete already: no bytes
    SetStoredChecksums(empty.Whole(), empty.Blocks(), checksum_block_bytes_, &records_.pieces[i]);
  }
}

CompressedFileStream::~CompressedFileStream() { Close(); }

void CompressedFileStream::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status CompressedFileStream::WriteAt(int64_t offset, const char* data, int64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed_ =
          ErrnoStatus(n < 0 ? errno : EIO,
                      absl::StrCat("write of ", bytes, " bytes at offset ", offset, " of ", path_));
      return failed_;
    }
    data += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status CompressedFileStream::Begin(int piece) {
  Piece& p = pieces_[piece];
  if (open_.piece >= 0 && open_.piece != piece) {
    return absl::FailedPreconditionError(absl::StrCat("tensor ", p.key, ": begun in ", path_,
                                                      " while tensor ", pieces_[open_.piece].key,
                                                      " is still being written"));
  }
  if (open_.piece == piece) return absl::OkStatus();
  if (p.raw_done > 0 || p.raw_size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", p.key, ": written to ", path_, " already"));
  }
  open_.piece = piece;
  open_.head_bytes = FrameIndexBytes(p.raw_size, p.params.chunk_bytes);
  const int64_t b = checksum_block_bytes_;
  open_.prefix_end = (open_.head_bytes + b - 1) / b * b;
  open_.frame_pos = open_.head_bytes;
  open_.entries.clear();
  open_.entries.reserve(static_cast<size_t>(open_.head_bytes / kFrameIndexEntryBytes));
  open_.retained.clear();
  open_.tail = std::make_unique<StreamingChecksum>(b);
  p.frame_start = pos_;
  pos_ += open_.head_bytes;  // the header and index go there once the chunks are known
  return absl::OkStatus();
}

absl::Status CompressedFileStream::CheckChunks(const Piece& p, const EncodedChunk* chunks,
                                               size_t n) const {
  int64_t raw = p.raw_done;
  for (size_t i = 0; i < n; ++i) {
    const int64_t want = std::min(p.params.chunk_bytes, p.raw_size - raw);
    if (want <= 0 || chunks[i].raw_bytes != want ||
        static_cast<int64_t>(chunks[i].bytes.size()) > chunks[i].raw_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", p.key, ": encoded chunk of ", chunks[i].raw_bytes, " raw bytes at raw offset ",
          raw, " of ", p.raw_size, " for ", path_, " (chunks of ", p.params.chunk_bytes, ")"));
    }
    raw += want;
  }
  return absl::OkStatus();
}

absl::Status CompressedFileStream::WriteChunks(const EncodedChunk* chunks, size_t n) {
  const int64_t start = pos_;
  constexpr size_t kMaxIov = 256;
  for (size_t first = 0; first < n; first += kMaxIov) {
    iovec iov[kMaxIov];
    const size_t count = std::min(kMaxIov, n - first);
    int64_t bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      const std::string& b = chunks[first + i].bytes;
      iov[i] = {const_cast<char*>(b.data()), b.size()};
      bytes += static_cast<int64_t>(b.size());
    }
    const ssize_t got = ::pwritev(fd_, iov, static_cast<int>(count), header_bytes_ + pos_);
    if (got == bytes) {
      pos_ += bytes;
      continue;
    }
    if (got < 0 && errno != EINTR) {
      failed_ = ErrnoStatus(errno, absl::StrCat("write of ", bytes, " bytes at offset ",
                                                header_bytes_ + pos_, " of ", path_));
      return failed_;
    }
    for (size_t i = 0; i < count; ++i) {  // short or interrupted: chunk by chunk
      const std::string& b = chunks[first + i].bytes;
      CKPT_RETURN_IF_ERROR(WriteAt(header_bytes_ + pos_, b.data(), static_cast<int64_t>(b.size())));
      pos_ += static_cast<int64_t>(b.size());
    }
  }
  // The disk starts on these bytes now, while the next run is encoded (not waited for).
  if (pos_ > start) {
    (void)::sync_file_range(fd_, header_bytes_ + start, pos_ - start, SYNC_FILE_RANGE_WRITE);
  }
  return absl::OkStatus();
}

void CompressedFileStream::HashChunks(const EncodedChunk* chunks, size_t n, bool completes,
                                      std::vector<absl::string_view>* deferred) {
  for (size_t i = 0; i < n; ++i) {
    absl::string_view b = chunks[i].bytes;
    open_.entries.push_back({static_cast<uint32_t>(b.size()), chunks[i].flags, chunks[i].raw_xxh3});
    if (open_.frame_pos < open_.prefix_end && !b.empty()) {
      const size_t in_prefix =
          static_cast<size_t>(std::min<int64_t>(b.size(), open_.prefix_end - open_.frame_pos));
      if (completes) {
        deferred->push_back(b.substr(0, in_prefix));
      } else {
        open_.retained.append(b.data(), in_prefix);
      }
      open_.frame_pos += static_cast<int64_t>(in_prefix);
      b.remove_prefix(in_prefix);
    }
    open_.tail->Update(b.data(), b.size());
    open_.frame_pos += static_cast<int64_t>(b.size());
  }
}

absl::Status CompressedFileStream::Complete(const std::vector<absl::string_view>& deferred) {
  Piece& p = pieces_[open_.piece];
  const std::string head = EncodeFrameHead(p.params, p.raw_size, open_.entries);
  CKPT_RETURN_IF_ERROR(
      WriteAt(header_bytes_ + p.frame_start, head.data(), static_cast<int64_t>(head.size())));
  StreamingChecksum prefix(checksum_block_bytes_);  // the frame's first blocks, in order
  prefix.Update(head.data(), head.size());
  prefix.Update(open_.retained.data(), open_.retained.size());
  for (absl::string_view d : deferred) prefix.Update(d.data(), d.size());
  std::vector<uint64_t> blocks = prefix.Blocks();
  for (uint64_t b : open_.tail->Blocks()) blocks.push_back(b);
  std::vector<uint64_t> raw_hashes;
  raw_hashes.reserve(open_.entries.size());
  for (const FrameEntry& e : open_.entries) raw_hashes.push_back(e.raw_xxh3);
  p.frame_bytes = open_.frame_pos;
  pb::StoredPiece& sp = records_.pieces[open_.piece];
  sp.set_codec(static_cast<uint32_t>(p.params.codec));
  sp.set_stored_length(p.frame_bytes);
  sp.set_raw_xxh3_64(RangeChecksum(raw_hashes));
  sp.set_codec_chunk_bytes(p.params.chunk_bytes);
  sp.clear_block_xxh3();
  SetStoredChecksums(RangeChecksum(blocks), blocks, checksum_block_bytes_, &sp);
  open_.piece = -1;
  open_.tail.reset();
  return absl::OkStatus();
}

absl::Status CompressedFileStream::AppendEncoded(int piece, const EncodedChunk* chunks, size_t n) {
  if (!failed_.ok()) return failed_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  if (piece < 0 || piece >= num_pieces()) {
    return absl::InvalidArgumentError(absl::StrCat("no piece ", piece, " in ", path_));
  }
  if (n == 0) return absl::OkStatus();
  Piece& p = pieces_[piece];
  CKPT_RETURN_IF_ERROR(CheckChunks(p, chunks, n));
  CKPT_RETURN_IF_ERROR(Begin(piece));
  CKPT_RETURN_IF_ERROR(WriteChunks(chunks, n));
  int64_t raw = 0;
  for (size_t i = 0; i < n; ++i) raw += chunks[i].raw_bytes;
  const bool completes = p.raw_done + raw == p.raw_size;
  std::vector<absl::string_view> deferred;
  HashChunks(chunks, n, completes, &deferred);
  p.raw_done += raw;
  raw_appended_ += raw;
  if (completes) CKPT_RETURN_IF_ERROR(Complete(deferred));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CompressedFileStream::FinalHeader() {
  std::vector<int64_t> begin(pieces_.size()), stored(pieces_.size());
  bool packed = false;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    begin[i] = pieces_[i].frame_start;
    stored[i] = pieces_[i].frame_bytes;
    packed = packed || stored[i] > 0;
  }
  CKPT_ASSIGN_OR_RETURN(
      std::string header,
      EncodeSafetensorsHeader(Entries(raw_entries_, begin, stored, pos_),
                              FileMetadata(writer_rank_, packed), kHeaderAlignment));
  if (static_cast<int64_t>(header.size()) > header_bytes_) {
    return absl::InternalError(absl::StrCat("the header of ", path_, " takes ", header.size(),
                                            " bytes; ", header_bytes_, " were reserved"));
  }
  // Padded with spaces (JSON whitespace) to the reserved size, its length prefix set to match.
  header.append(static_cast<size_t>(header_bytes_) - header.size(), ' ');
  const uint64_t json = static_cast<uint64_t>(header_bytes_ - 8);
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((json >> (8 * i)) & 0xFF);
  return header;
}

absl::StatusOr<WrittenData> CompressedFileStream::Finish() {
  if (!failed_.ok()) return failed_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  for (const Piece& p : pieces_) {
    if (p.raw_done != p.raw_size) {
      return absl::FailedPreconditionError(absl::StrCat("tensor ", p.key, ": ", p.raw_done, " of ",
                                                        p.raw_size, " bytes written to ", path_));
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::string header, FinalHeader());
  CKPT_RETURN_IF_ERROR(WriteAt(0, header.data(), header_bytes_));
  if (::ftruncate(fd_, header_bytes_ + pos_) != 0) {
    failed_ = ErrnoStatus(errno, absl::StrCat("truncate ", path_));
    return failed_;
  }
  failed_ = FsyncFd(fd_, path_);
  Close();
  if (!failed_.ok()) return failed_;
  pb::DataFile& file = records_.files.at(0);
  file.set_data_start(header_bytes_);
  file.set_size_bytes(header_bytes_ + pos_);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const int64_t at = pieces_[i].raw_size > 0 ? pieces_[i].frame_start : pos_;
    records_.pieces[i].set_byte_offset(header_bytes_ + at);
  }
  return std::move(records_);
}

}  // namespace ckpt
