#include "storage/manifest_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
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
  const size_t size = piece.ByteSizeLong();
  out->push_back(static_cast<char>(kPiecesTag));
  uint8_t varint[10];
  const uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(size, varint);
  out->append(reinterpret_cast<const char*>(varint), end - varint);
  piece.AppendToString(out);
}

// The fields of `head` serialized before its pieces (1-2), with format `version`.
pb::Manifest FieldsBefore(const pb::Manifest& head, uint32_t version) {
  pb::Manifest before;
  before.set_format_version(version);
  *before.mutable_tensors() = head.tensors();
  return before;
}

// The fields of `head` serialized after its pieces, but its piece files (4-10). Copied one by
// one (never the pieces); manifest_file_test checks every field of Manifest is here or above.
pb::Manifest FieldsAfter(const pb::Manifest& head) {
  pb::Manifest after;
  if (head.has_saved_layout()) *after.mutable_saved_layout() = head.saved_layout();
  after.set_step(head.step());
  *after.mutable_user_metadata() = head.user_metadata();
  after.set_created_unix_micros(head.created_unix_micros());
  after.set_writer_version(head.writer_version());
  *after.mutable_files() = head.files();
  after.set_checksum_block_bytes(head.checksum_block_bytes());
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

// Moves the pieces of piece file `record` of the checkpoint in `dir` to the end of `m`.
absl::Status AppendPieceFile(const std::string& dir, const pb::ManifestPieceFile& record,
                             pb::Manifest* m) {
  const std::string path = JoinPath(dir, record.name());
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("manifest piece file ", path, " ", what));
  };
  CKPT_ASSIGN_OR_RETURN(const int64_t size, FileSize(path));
  if (size != record.size_bytes()) {
    return bad(absl::StrCat("is ", size, " bytes; manifest.pb says ", record.size_bytes()));
  }
  if (size > kMaxManifestBytes - 1) return bad("is larger than protobuf parses");
  pb::ManifestPieces pieces;
  {
    CKPT_ASSIGN_OR_RETURN(const std::string bytes, ReadFileRange(path, 0, size));
    if (Xxh3(bytes.data(), bytes.size()) != record.xxh3_64()) {
      return bad("does not match its checksum in manifest.pb");
    }
    if (!pieces.ParseFromString(bytes)) return bad("is not a valid protobuf");
  }
  if (pieces.pieces_size() != record.piece_count()) {
    return bad(absl::StrCat("holds ", pieces.pieces_size(), " pieces; manifest.pb says ",
                            record.piece_count()));
  }
  if (record.piece_count() > std::numeric_limits<int>::max() - m->pieces_size()) {
    return bad("takes the manifest past the most pieces a manifest holds");
  }
  std::vector<pb::StoredPiece*> moved(pieces.pieces_size());
  pieces.mutable_pieces()->ExtractSubrange(0, pieces.pieces_size(), moved.data());
  for (pb::StoredPiece* p : moved) m->mutable_pieces()->AddAllocated(p);
  return absl::OkStatus();
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

absl::StatusOr<pb::Manifest> ReadManifestHead(const std::string& checkpoint_dir) {
  const std::string path = JoinPath(checkpoint_dir, kManifestFileName);
  CKPT_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path, kMaxManifestBytes));
  return ParseManifestHead(bytes, path);
}

absl::StatusOr<pb::Manifest> ReadManifestFile(const std::string& checkpoint_dir) {
  CKPT_ASSIGN_OR_RETURN(pb::Manifest m, ReadManifestHead(checkpoint_dir));
  for (const pb::ManifestPieceFile& record : m.piece_files()) {
    CKPT_RETURN_IF_ERROR(AppendPieceFile(checkpoint_dir, record, &m));
  }
  absl::Status s = ValidateManifest(m);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(JoinPath(checkpoint_dir, kManifestFileName), ": ", s.message()));
  }
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
