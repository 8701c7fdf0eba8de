#include "storage/manifest_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/deterministic.h"
#include "storage/checksum.h"
#include "storage/file_util.h"

namespace ckpt {
namespace {

// Bytes buffered between write(2) calls.
constexpr int kWriteBufferBytes = 1 << 20;
// The tag of Manifest.pieces and ManifestPieces.pieces: field 3, length-delimited.
constexpr uint8_t kPiecesTag = (3 << 3) | 2;

// Streams what `serialize` writes into the open `fd`.
absl::Status StreamManifest(int fd, const std::string& path, ManifestSerializer serialize) {
  google::protobuf::io::FileOutputStream file(fd, kWriteBufferBytes);
  absl::Status serialized;
  bool coded_error = false;
  {
    google::protobuf::io::CodedOutputStream coded(&file);
    coded.SetSerializationDeterministic(true);
    serialized = serialize(&coded);
    coded_error = coded.HadError();
  }  // the coded stream hands its unused buffer back to `file` here
  const bool flushed = file.Flush();
  if (file.GetErrno() != 0) return ErrnoStatus(file.GetErrno(), absl::StrCat("write ", path));
  if (!serialized.ok()) return serialized;
  if (coded_error || !flushed) {
    return absl::InternalError(absl::StrCat("cannot write the manifest into ", path));
  }
  return absl::OkStatus();
}

// Appends `piece` as the pieces field serializes it: tag, length, message.
void AppendPieceRecord(const pb::StoredPiece& piece, std::string* out) {
  AppendMessageField(pb::Manifest::kPiecesFieldNumber, piece, out);
}

// The fields of `head` serialized before its pieces (1-2), with format `version`.
pb::Manifest FieldsBefore(const pb::Manifest& head, uint32_t version) {
  pb::Manifest before;
  before.set_format_version(version);
  *before.mutable_tensors() = head.tensors();
  return before;
}

// The fields of `head` serialized after its pieces, but its piece files (4-10, 12). Copied one
// by one (never the pieces); manifest_file_test checks every field of Manifest is here or above.
pb::Manifest FieldsAfter(const pb::Manifest& head) {
  pb::Manifest after;
  if (head.has_saved_layout()) *after.mutable_saved_layout() = head.saved_layout();
  after.set_step(head.step());
  *after.mutable_user_metadata() = head.user_metadata();
  after.set_created_unix_micros(head.created_unix_micros());
  after.set_writer_version(head.writer_version());
  *after.mutable_files() = head.files();
  after.set_checksum_block_bytes(head.checksum_block_bytes());
  after.set_object_generation(head.object_generation());
  return after;
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Writes pieces into consecutive piece files of at most a byte budget each, hashing them as
// they go; each file is fsynced when it is full, the directory once all are.
class PieceFileWriter {
 public:
  PieceFileWriter(std::string dir, int64_t budget) : dir_(std::move(dir)), budget_(budget) {}
  ~PieceFileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  PieceFileWriter(const PieceFileWriter&) = delete;
  PieceFileWriter& operator=(const PieceFileWriter&) = delete;

  absl::Status Add(const pb::StoredPiece& piece);
  // Closes the last file and fsyncs the directory.
  absl::Status Finish();
  // Every piece file, once Finish succeeded.
  const std::vector<pb::ManifestPieceFile>& files() const { return files_; }
  // Removes every file this writer created.
  void RemoveAll();

 private:
  absl::Status Open();
  absl::Status Close();

  const std::string dir_;
  const int64_t budget_;
  int fd_ = -1;
  int created_ = 0;
  std::string path_;    // of the open file
  std::string buffer_;  // its bytes not yet written
  std::string record_;  // one piece's bytes
  std::unique_ptr<StreamingChecksum> hash_;
  pb::ManifestPieceFile current_;
  std::vector<pb::ManifestPieceFile> files_;
};

absl::Status PieceFileWriter::Add(const pb::StoredPiece& piece) {
  record_.clear();
  AppendPieceRecord(piece, &record_);
  const int64_t size = static_cast<int64_t>(record_.size());
  if (fd_ >= 0 && current_.size_bytes() + size > budget_) CKPT_RETURN_IF_ERROR(Close());
  if (fd_ < 0) CKPT_RETURN_IF_ERROR(Open());
  hash_->Update(record_.data(), record_.size());
  current_.set_size_bytes(current_.size_bytes() + size);
  current_.set_piece_count(current_.piece_count() + 1);
  buffer_ += record_;
  if (buffer_.size() < kWriteBufferBytes) return absl::OkStatus();
  absl::Status written = WriteAll(fd_, buffer_, path_);
  buffer_.clear();
  return written;
}

absl::Status PieceFileWriter::Open() {
  const int index = static_cast<int>(files_.size());
  if (index >= kMaxManifestPieceFiles) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the manifest in ", dir_, " needs more than ", kMaxManifestPieceFiles,
                     " piece files of ", budget_, " bytes; the checkpoint was not committed"));
  }
  current_.Clear();
  current_.set_name(ManifestPieceFileName(index));
  path_ = JoinPath(dir_, current_.name());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return ErrnoStatus(errno, absl::StrCat("create ", path_));
  ++created_;
  hash_ = std::make_unique<StreamingChecksum>();
  return absl::OkStatus();
}

absl::Status PieceFileWriter::Close() {
  const int fd = fd_;
  fd_ = -1;
  FdCloser closer(fd);
  CKPT_RETURN_IF_ERROR(WriteAll(fd, buffer_, path_));
  buffer_.clear();
  CKPT_RETURN_IF_ERROR(FsyncFd(fd, path_));
  current_.set_xxh3_64(hash_->Whole());
  files_.push_back(current_);
  return absl::OkStatus();
}

absl::Status PieceFileWriter::Finish() {
  if (fd_ >= 0) CKPT_RETURN_IF_ERROR(Close());
  return FsyncDir(dir_);
}

void PieceFileWriter::RemoveAll() {
  for (int i = 0; i < created_; ++i) {
    ::unlink(JoinPath(dir_, ManifestPieceFileName(i)).c_str());
  }
}

// Format 1: manifest.pb with everything, its pieces streamed between the other fields.
absl::Status WriteSingleFile(const std::string& path, const pb::Manifest& before,
                             const pb::Manifest& after, int64_t total_bytes,
                             ManifestPieceSource source) {
  return WriteManifestDurably(path, [&](google::protobuf::io::CodedOutputStream* out) {
    if (!before.SerializeToCodedStream(out)) {
      return absl::InternalError(absl::StrCat("cannot serialize the manifest for ", path));
    }
    std::string record;
    CKPT_RETURN_IF_ERROR(source([&](const pb::StoredPiece& piece) {
      record.clear();
      AppendPieceRecord(piece, &record);
      out->WriteRaw(record.data(), static_cast<int>(record.size()));
      return absl::OkStatus();
    }));
    if (!after.SerializeToCodedStream(out)) {
      return absl::InternalError(absl::StrCat("cannot serialize the manifest for ", path));
    }
    if (out->ByteCount() != total_bytes) {
      return absl::InternalError(absl::StrCat("the manifest for ", path, " is ", out->ByteCount(),
                                              " bytes, not the ", total_bytes, " announced"));
    }
    return absl::OkStatus();
  });
}

// Format 2: the pieces into piece files, then manifest.pb listing them.
absl::Status WritePieceFiles(const std::string& dir, const std::string& path,
                             const pb::Manifest& head, int64_t pieces_bytes,
                             ManifestPieceSource source, const ManifestFileOptions& options) {
  pb::Manifest top = FieldsAfter(head);
  top.set_format_version(kManifestPieceFilesFormatVersion);
  *top.mutable_tensors() = head.tensors();
  if (static_cast<int64_t>(top.ByteSizeLong()) > kMaxManifestBytes - 1) {  // protobuf's limit
    return absl::ResourceExhaustedError(
        absl::StrCat("the manifest for ", path, " is ", top.ByteSizeLong(),
                     " bytes without its pieces, more than one file holds; not committed"));
  }
  PieceFileWriter writer(dir, std::max<int64_t>(1, options.piece_file_bytes));
  int64_t written = 0;
  absl::Status s = source([&](const pb::StoredPiece& piece) {
    written += PieceRecordBytes(piece);
    return writer.Add(piece);
  });
  if (s.ok() && written != pieces_bytes) {
    s = absl::InternalError(absl::StrCat("the pieces of the manifest for ", path, " are ", written,
                                         " bytes, not the ", pieces_bytes, " announced"));
  }
  if (s.ok()) s = writer.Finish();
  if (s.ok()) {
    top.mutable_piece_files()->Add(writer.files().begin(), writer.files().end());
    s = WriteManifestDurably(path, top);
  }
  if (!s.ok()) writer.RemoveAll();
  return s;
}

namespace io = google::protobuf::io;
using google::protobuf::internal::WireFormatLite;

// Bytes read from a manifest file at a time.
constexpr int kReadBufferBytes = 1 << 20;
// A coded stream counts its bytes in an int: a fresh one takes over past this many (far below
// INT_MAX, so a test of a few tens of MiB goes through the hand-over).
constexpr int kCodedStreamRenewBytes = 64 << 20;

// Reads a file from its start through pread(2), hashing each byte once as it is read (when
// given a hash).
class HashingFileStream : public io::CopyingInputStream {
 public:
  HashingFileStream(int fd, StreamingChecksum* hash) : fd_(fd), hash_(hash) {}

  int Read(void* buffer, int size) override {
    for (;;) {
      const ssize_t n = ::pread(fd_, buffer, static_cast<size_t>(size), bytes_);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        errno_ = errno;
        return -1;
      }
      if (hash_ != nullptr) hash_->Update(buffer, static_cast<size_t>(n));
      bytes_ += n;
      return static_cast<int>(n);
    }
  }
  // Reads (and hashes) the rest of the file.
  void Drain() {
    std::string buffer(kReadBufferBytes, '\0');
    while (Read(buffer.data(), kReadBufferBytes) > 0) {
    }
  }
  int64_t bytes() const { return bytes_; }
  // errno of a failed read, or 0.
  int error() const { return errno_; }

 private:
  const int fd_;
  StreamingChecksum* const hash_;
  int64_t bytes_ = 0;
  int errno_ = 0;
};

// Receives one top-level field of a message being walked, positioned after its tag `tag`; it
// consumes the field. False ends the walk.
using FieldVisitor = absl::FunctionRef<bool(io::CodedInputStream& in, uint32_t tag)>;

// The most bytes a tag takes (a 32-bit varint).
constexpr int kMaxTagBytes = 5;

// Walks the top-level fields of the message in `input`, in order, until its end. False when a
// field visitor returns false or the bytes are not a message (a truncated or overlong varint, a
// wire type that does not parse, a length past the end, an end-group at the top).
bool WalkFields(io::ZeroCopyInputStream* input, FieldVisitor field) {
  std::optional<io::CodedInputStream> in;
  for (;;) {
    if (!in.has_value() || in->CurrentPosition() > kCodedStreamRenewBytes) {
      in.reset();  // hands its unread bytes back to `input`
      in.emplace(input);
      in->SetTotalBytesLimit(std::numeric_limits<int>::max());
    }
    const int before = in->CurrentPosition();
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return in->ConsumedEntireMessage();
    // A whole-message parse refuses a tag of more than 5 bytes; ReadTag reads on (up to 10)
    // and keeps the low 32 bits, which may name a valid field.
    if (in->CurrentPosition() - before > kMaxTagBytes) return false;
    if (!field(*in, tag)) return false;
  }
}

// Reads one pieces record (positioned after its tag) into `piece`.
bool ReadPieceRecord(io::CodedInputStream& in, pb::StoredPiece& piece) {
  piece.Clear();
  return WireFormatLite::ReadMessage(&in, &piece);
}

// manifest.pb's bytes, read from their start once per pass.
class ManifestSource {
 public:
  virtual ~ManifestSource() = default;
  // A stream over the bytes from their start (the previous one is no longer used).
  virtual io::ZeroCopyInputStream* Rewind() = 0;
  // The error reading the bytes, if any (not a fault of the bytes).
  virtual absl::Status ReadError() const = 0;
};

// manifest.pb open for reading (closed with this).
class FileSource : public ManifestSource {
 public:
  FileSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~FileSource() override {
    adaptor_.reset();
    ::close(fd_);
  }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  io::ZeroCopyInputStream* Rewind() override {
    adaptor_.reset();
    file_.emplace(fd_, nullptr);
    adaptor_.emplace(&*file_, kReadBufferBytes);
    return &*adaptor_;
  }
  absl::Status ReadError() const override {
    if (!file_.has_value() || file_->error() == 0) return absl::OkStatus();
    return ErrnoStatus(file_->error(), absl::StrCat("read ", path_));
  }

 private:
  const int fd_;
  const std::string path_;
  std::optional<HashingFileStream> file_;
  std::optional<io::CopyingInputStreamAdaptor> adaptor_;
};

// Opens manifest.pb at `path`: at most kMaxManifestBytes, as a whole read takes.
absl::StatusOr<std::unique_ptr<FileSource>> OpenManifestSource(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(const int64_t size, FileSize(path));
  if (size > kMaxManifestBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", size, " bytes, more than the limit of ", kMaxManifestBytes));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  return std::make_unique<FileSource>(fd, path);
}

class BytesSource : public ManifestSource {
 public:
  explicit BytesSource(absl::string_view bytes) : bytes_(bytes) {}
  io::ZeroCopyInputStream* Rewind() override {
    stream_.emplace(bytes_.data(), static_cast<int>(bytes_.size()), kReadBufferBytes);
    return &*stream_;
  }
  absl::Status ReadError() const override { return absl::OkStatus(); }

 private:
  const absl::string_view bytes_;
  std::optional<io::ArrayInputStream> stream_;
};

absl::Status NotAProtobuf(absl::string_view path) {
  return absl::DataLossError(absl::StrCat("manifest ", path, " is not a valid protobuf"));
}

// manifest.pb's head (every field but its pieces) and how many pieces it holds itself.
struct ScannedHead {
  pb::Manifest head;
  int64_t own_pieces = 0;
};

// Pass 1 over manifest.pb: every field but the pieces copied, in order, and parsed as the head
// (as a whole-message parse would merge them); the pieces counted, not parsed. Then its format
// (CheckManifestHead).
absl::StatusOr<ScannedHead> ScanHead(ManifestSource& source, absl::string_view path) {
  std::string bytes;
  ScannedHead scanned;
  bool valid = false;
  {
    io::StringOutputStream sink(&bytes);
    io::CodedOutputStream out(&sink);
    valid = WalkFields(source.Rewind(), [&](io::CodedInputStream& in, uint32_t tag) {
      if (tag != kPiecesTag) return WireFormatLite::SkipField(&in, tag, &out);
      ++scanned.own_pieces;
      return WireFormatLite::SkipField(&in, tag);
    });
  }  // `out` flushes into `bytes` here
  CKPT_RETURN_IF_ERROR(source.ReadError());
  if (!valid || !scanned.head.ParseFromString(bytes)) return NotAProtobuf(path);
  absl::Status format = CheckManifestHead(scanned.head, scanned.own_pieces, path);
  if (format.ok()) return scanned;
  // As a whole-message parse does, a piece that does not parse makes the bytes no protobuf
  // before their format is looked at (a pass over the pieces only on this error path).
  pb::StoredPiece piece;
  valid = WalkFields(source.Rewind(), [&](io::CodedInputStream& in, uint32_t tag) {
    return tag == kPiecesTag ? ReadPieceRecord(in, piece) : WireFormatLite::SkipField(&in, tag);
  });
  CKPT_RETURN_IF_ERROR(source.ReadError());
  return valid ? format : NotAProtobuf(path);
}

// Hands a manifest's pieces, as they are read, to a ManifestValidator and then to a visitor,
// with their indices; validation errors name manifest.pb (`path`), as ReadManifestFile's.
class PieceFeed {
 public:
  PieceFeed(absl::string_view path, ManifestHeadVisitor on_head, ManifestPieceVisitor visit)
      : path_(path), on_head_(on_head), visit_(visit) {}

  // Checks `head` and hands it to the head visitor, before any piece.
  absl::Status Start(const pb::Manifest& head, int64_t num_pieces) {
    validator_.Reserve(static_cast<int>(std::min<int64_t>(num_pieces, kMaxReserve)));
    CKPT_RETURN_IF_ERROR(Named(validator_.Start(head)));
    return on_head_(head);
  }
  absl::Status Validate(const pb::StoredPiece& piece) { return Named(validator_.AddPiece(piece)); }
  absl::Status Visit(pb::StoredPiece& piece) { return visit_(next_++, piece); }
  absl::Status Finish() { return Named(validator_.Finish()); }

 private:
  // Reserved at most (a hostile count reserves no more; the vectors grow past it).
  static constexpr int64_t kMaxReserve = int64_t{1} << 26;

  absl::Status Named(const absl::Status& s) const {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(path_, ": ", s.message()));
  }

  const std::string path_;
  ManifestHeadVisitor on_head_;
  ManifestPieceVisitor visit_;
  ManifestValidator validator_;
  int64_t next_ = 0;
};

// Pass 2 over a format-1 manifest.pb: each of its own pieces, in order, into `feed`.
absl::Status StreamOwnPieces(ManifestSource& source, absl::string_view path, PieceFeed& feed) {
  pb::StoredPiece piece;
  absl::Status fault;
  const bool valid = WalkFields(source.Rewind(), [&](io::CodedInputStream& in, uint32_t tag) {
    if (tag != kPiecesTag) return WireFormatLite::SkipField(&in, tag);
    if (!ReadPieceRecord(in, piece)) return false;
    fault = feed.Validate(piece);
    if (fault.ok()) fault = feed.Visit(piece);
    return fault.ok();
  });
  if (!fault.ok()) return fault;
  CKPT_RETURN_IF_ERROR(source.ReadError());
  if (!valid) return NotAProtobuf(path);
  return absl::OkStatus();
}

// The pieces of a self-contained (format 1) manifest whose head `scanned` holds, streamed from
// `source` into `feed`, validated; returns the head.
absl::StatusOr<pb::Manifest> StreamSingleFile(ManifestSource& source, absl::string_view path,
                                              ScannedHead scanned, PieceFeed& feed) {
  CKPT_RETURN_IF_ERROR(feed.Start(scanned.head, scanned.own_pieces));
  CKPT_RETURN_IF_ERROR(StreamOwnPieces(source, path, feed));
  CKPT_RETURN_IF_ERROR(feed.Finish());
  return std::move(scanned.head);
}

absl::Status PieceFileError(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("manifest piece file ", path, " ", what));
}

// Before any piece file is read, as a whole read finds them: each present with its recorded
// size, and their pieces few enough for one manifest. Returns the pieces they hold.
absl::StatusOr<int64_t> CheckPieceFilesPresent(const std::string& dir, const pb::Manifest& head) {
  int64_t pieces = 0;
  for (const pb::ManifestPieceFile& record : head.piece_files()) {
    const std::string path = JoinPath(dir, record.name());
    CKPT_ASSIGN_OR_RETURN(const int64_t size, FileSize(path));
    if (size != record.size_bytes()) {
      return PieceFileError(
          path, absl::StrCat("is ", size, " bytes; manifest.pb says ", record.size_bytes()));
    }
    if (size > kMaxManifestBytes - 1) return PieceFileError(path, "is larger than protobuf parses");
    if (record.piece_count() > std::numeric_limits<int>::max() - pieces) {
      return PieceFileError(path, "takes the manifest past the most pieces a manifest holds");
    }
    pieces += record.piece_count();
  }
  return pieces;
}

// What streaming one piece file found.
struct PieceFileRead {
  bool parsed = false;   // its bytes were a ManifestPieces message
  int64_t pieces = 0;    // records in it
  absl::Status fault;    // a piece that did not validate
  absl::Status visitor;  // the visitor's error
};

// Streams the pieces records of the piece file open as `file` into `feed`; records past the
// `expected` are counted, not handed on.
PieceFileRead WalkPieceFile(HashingFileStream& file, int64_t expected, PieceFeed& feed) {
  PieceFileRead read;
  pb::StoredPiece piece;
  io::CopyingInputStreamAdaptor input(&file, kReadBufferBytes);
  read.parsed = WalkFields(&input, [&](io::CodedInputStream& in, uint32_t tag) {
    if (tag != kPiecesTag) return WireFormatLite::SkipField(&in, tag);
    if (!ReadPieceRecord(in, piece)) return false;
    if (++read.pieces > expected) return true;
    read.fault = feed.Validate(piece);
    if (read.fault.ok()) read.visitor = feed.Visit(piece);
    return read.fault.ok() && read.visitor.ok();
  });
  return read;
}

// Streams piece file `record` of the checkpoint in `dir` into `feed`, hashing it as it is read;
// then checks its size, checksum and piece count against the record. A file that does not
// parse or holds a piece that does not validate is read to its end first: a checksum mismatch
// is reported before what the corruption looked like.
absl::Status StreamPieceFile(const std::string& dir, const pb::ManifestPieceFile& record,
                             PieceFeed& feed) {
  const std::string path = JoinPath(dir, record.name());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(fd);
  StreamingChecksum hash;
  HashingFileStream file(fd, &hash);
  const PieceFileRead read = WalkPieceFile(file, record.piece_count(), feed);
  if (!read.visitor.ok()) return read.visitor;
  if (!read.parsed || !read.fault.ok()) file.Drain();
  if (file.error() != 0) return ErrnoStatus(file.error(), absl::StrCat("read ", path));
  if (file.bytes() != record.size_bytes()) {
    return PieceFileError(
        path, absl::StrCat("is ", file.bytes(), " bytes; manifest.pb says ", record.size_bytes()));
  }
  if (hash.Whole() != record.xxh3_64()) {
    return PieceFileError(path, "does not match its checksum in manifest.pb");
  }
  if (!read.fault.ok()) return read.fault;  // (what stopped the walk)
  if (!read.parsed) return PieceFileError(path, "is not a valid protobuf");
  if (read.pieces != record.piece_count()) {
    return PieceFileError(path, absl::StrCat("holds ", read.pieces, " pieces; manifest.pb says ",
                                             record.piece_count()));
  }
  return absl::OkStatus();
}

// The pieces of a format-2 manifest whose head `head` lists, streamed from its piece files in
// `dir` into `feed`, validated; returns the head.
absl::StatusOr<pb::Manifest> StreamPieceFiles(const std::string& dir, pb::Manifest head,
                                              PieceFeed& feed) {
  CKPT_ASSIGN_OR_RETURN(const int64_t pieces, CheckPieceFilesPresent(dir, head));
  CKPT_RETURN_IF_ERROR(feed.Start(head, pieces));
  for (const pb::ManifestPieceFile& record : head.piece_files()) {
    CKPT_RETURN_IF_ERROR(StreamPieceFile(dir, record, feed));
  }
  CKPT_RETURN_IF_ERROR(feed.Finish());
  return head;
}

}  // namespace

int64_t PieceRecordBytes(const pb::StoredPiece& piece) {
  const size_t size = piece.ByteSizeLong();
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(size) +
         static_cast<int64_t>(size);
}

absl::Status WriteManifestFiles(const std::string& dir, const std::string& manifest_name,
                                const pb::Manifest& head, int64_t pieces_bytes,
                                ManifestPieceSource source, const ManifestFileOptions& options) {
  const std::string path = JoinPath(dir, manifest_name);
  const pb::Manifest before = FieldsBefore(head, kManifestFormatVersion);
  const pb::Manifest after = FieldsAfter(head);
  const int64_t total = static_cast<int64_t>(before.ByteSizeLong()) + pieces_bytes +
                        static_cast<int64_t>(after.ByteSizeLong());
  if (total <= options.max_single_file_bytes || pieces_bytes == 0) {
    return WriteSingleFile(path, before, after, total, source);
  }
  return WritePieceFiles(dir, path, head, pieces_bytes, source, options);
}

absl::Status WriteManifestFiles(const std::string& dir, const std::string& manifest_name,
                                const pb::Manifest& manifest, const ManifestFileOptions& options) {
  int64_t pieces_bytes = 0;
  for (const pb::StoredPiece& p : manifest.pieces()) pieces_bytes += PieceRecordBytes(p);
  return WriteManifestFiles(
      dir, manifest_name, manifest, pieces_bytes,
      [&](ManifestPieceSink sink) {
        for (const pb::StoredPiece& p : manifest.pieces()) CKPT_RETURN_IF_ERROR(sink(p));
        return absl::OkStatus();
      },
      options);
}

absl::StatusOr<pb::Manifest> StreamManifestFile(const std::string& checkpoint_dir,
                                                ManifestPieceVisitor visit) {
  return StreamManifestFile(
      checkpoint_dir, [](const pb::Manifest&) { return absl::OkStatus(); }, visit);
}

absl::StatusOr<pb::Manifest> StreamManifestFile(const std::string& checkpoint_dir,
                                                ManifestHeadVisitor on_head,
                                                ManifestPieceVisitor visit) {
  const std::string path = JoinPath(checkpoint_dir, kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FileSource> source, OpenManifestSource(path));
  CKPT_ASSIGN_OR_RETURN(ScannedHead scanned, ScanHead(*source, path));
  PieceFeed feed(path, on_head, visit);
  if (scanned.head.format_version() == kManifestPieceFilesFormatVersion) {
    return StreamPieceFiles(checkpoint_dir, std::move(scanned.head), feed);
  }
  return StreamSingleFile(*source, path, std::move(scanned), feed);
}

absl::StatusOr<pb::Manifest> StreamManifestBytes(absl::string_view bytes, absl::string_view path,
                                                 ManifestPieceVisitor visit) {
  if (static_cast<int64_t>(bytes.size()) > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is larger than 2 GiB"));
  }
  BytesSource source(bytes);
  CKPT_ASSIGN_OR_RETURN(ScannedHead scanned, ScanHead(source, path));
  if (scanned.head.format_version() == kManifestPieceFilesFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " keeps its pieces in ", scanned.head.piece_files_size(),
                     " piece files beside it: read it with ReadManifestFile"));
  }
  auto no_head = [](const pb::Manifest&) { return absl::OkStatus(); };
  PieceFeed feed(path, no_head, visit);  // keeps a reference to `no_head`
  return StreamSingleFile(source, path, std::move(scanned), feed);
}

absl::StatusOr<pb::Manifest> ReadManifestHead(const std::string& checkpoint_dir) {
  const std::string path = JoinPath(checkpoint_dir, kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FileSource> source, OpenManifestSource(path));
  CKPT_ASSIGN_OR_RETURN(ScannedHead scanned, ScanHead(*source, path));
  return std::move(scanned.head);
}

absl::StatusOr<pb::Manifest> ReadManifestFile(const std::string& checkpoint_dir) {
  google::protobuf::RepeatedPtrField<pb::StoredPiece> pieces;
  CKPT_ASSIGN_OR_RETURN(pb::Manifest m,
                        StreamManifestFile(checkpoint_dir, [&](int64_t, pb::StoredPiece& piece) {
                          *pieces.Add() = std::move(piece);
                          return absl::OkStatus();
                        }));
  m.mutable_pieces()->Swap(&pieces);
  return m;
}

absl::Status WriteManifestDurably(const std::string& path, const pb::Manifest& manifest) {
  return WriteManifestDurably(path, [&](google::protobuf::io::CodedOutputStream* out) {
    if (!manifest.SerializeToCodedStream(out)) {
      return absl::InternalError(absl::StrCat("cannot serialize the manifest for ", path,
                                              " (larger than protobuf's 2 GiB limit?)"));
    }
    return absl::OkStatus();
  });
}

absl::Status WriteManifestDurably(const std::string& path, ManifestSerializer serialize) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  FdCloser closer(fd);
  if (absl::Status s = StreamManifest(fd, path, serialize); !s.ok()) return s;
  return FsyncFd(fd, path);
}

}  // namespace ckpt
