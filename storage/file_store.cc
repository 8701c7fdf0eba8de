#include "storage/file_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_file.h"
#include "storage/overwrite_guard.h"

namespace ckpt {
namespace {

constexpr absl::string_view kFilePrefix = "file://";

// Writes one object into the staging directory: O_EXCL, so no object is written twice.
class FileObjectWriter final : public ObjectWriter {
 public:
  FileObjectWriter(int fd, std::string path, std::string name,
                   std::function<void(const std::string&, int64_t)> closed)
      : fd_(fd), path_(std::move(path)), name_(std::move(name)), closed_(std::move(closed)) {}
  ~FileObjectWriter() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view bytes) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("write ", path_));
      bytes.remove_prefix(static_cast<size_t>(n));
      size_ += n;
    }
    return absl::OkStatus();
  }

  absl::Status Close(absl::Time /*deadline*/) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    absl::Status synced = FsyncFd(fd_, path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && synced.ok()) synced = ErrnoStatus(errno, absl::StrCat("close ", path_));
    if (synced.ok()) closed_(name_, size_);
    return synced;
  }

 private:
  int fd_;
  const std::string path_;
  const std::string name_;
  const std::function<void(const std::string&, int64_t)> closed_;
  int64_t size_ = 0;
};

// A checkpoint directory being written in its staging sibling.
class FileWrite final : public CheckpointWrite {
 public:
  FileWrite(std::string url, std::string path, std::string staging, bool overwrite)
      : CheckpointWrite(std::move(url)),
        path_(std::move(path)),
        staging_(std::move(staging)),
        overwrite_(overwrite) {}
  ~FileWrite() override {
    if (!done_) (void)DiscardStagingDir(staging_);
  }

 protected:
  absl::StatusOr<std::unique_ptr<ObjectWriter>> CreateObject(const std::string& name) override {
    const std::string file = JoinPath(staging_, name);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", file, " of ", url()));
    return std::unique_ptr<ObjectWriter>(std::make_unique<FileObjectWriter>(
        fd, file, name,
        [this](const std::string& object, int64_t size) { RecordClosed(object, size); }));
  }

  absl::Status CommitManifest(const pb::Manifest& manifest, absl::Time /*deadline*/) override {
    if (done_) return absl::FailedPreconditionError(absl::StrCat(url(), ": write already ended"));
    WriteOptions options;
    options.overwrite = overwrite_;
    options.manifest_validated = true;
    CKPT_RETURN_IF_ERROR(CommitCheckpoint(staging_, path_, manifest, options));
    done_ = true;
    return absl::OkStatus();
  }

  absl::Status AbortWrite(absl::Time /*deadline*/) override {
    if (done_) return absl::OkStatus();
    done_ = true;
    return DiscardStagingDir(staging_);
  }

 private:
  const std::string path_;
  const std::string staging_;
  const bool overwrite_;
  bool done_ = false;
};

// A committed checkpoint directory; reads with pread.
class FileCheckpoint final : public StoredCheckpoint {
 public:
  FileCheckpoint(std::string url, std::string path, pb::Manifest manifest)
      : StoredCheckpoint(std::move(url), std::move(manifest)), path_(std::move(path)) {}

 protected:
  absl::Status ReadObject(const std::string& name, int64_t offset, absl::Span<char> dest,
                          absl::Time /*deadline*/) const override {
    const std::string file = JoinPath(path_, name);
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(absl::StrCat("checkpoint ", url(), ": ", file, " is missing"));
      }
      return ErrnoStatus(errno, absl::StrCat("open ", file));
    }
    FdCloser closer(fd);
    size_t done = 0;
    while (done < dest.size()) {
      const ssize_t n =
          ::pread(fd, dest.data() + done, dest.size() - done, offset + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", file));
      if (n == 0) {
        return absl::DataLossError(absl::StrCat("checkpoint ", url(), ": ", file,
                                                " is truncated: no bytes at offset ",
                                                offset + static_cast<int64_t>(done)));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

 private:
  const std::string path_;
};

class FileStore final : public CheckpointStore {
 public:
  absl::string_view scheme() const override { return "file"; }

  absl::StatusOr<std::unique_ptr<CheckpointWrite>> BeginWrite(const std::string& url,
                                                              const StoreWriteOptions& options,
                                                              absl::Time /*deadline*/) override {
    CKPT_ASSIGN_OR_RETURN(std::string path, FileStorePath(url));
    CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(path, options.overwrite));
    return std::unique_ptr<CheckpointWrite>(
        std::make_unique<FileWrite>(url, std::move(path), std::move(staging), options.overwrite));
  }

  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> Open(const std::string& url,
                                                         absl::Time /*deadline*/) override {
    CKPT_ASSIGN_OR_RETURN(std::string path, FileStorePath(url));
    CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
    CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ReadManifestFile(path));
    return std::unique_ptr<StoredCheckpoint>(
        std::make_unique<FileCheckpoint>(url, std::move(path), std::move(manifest)));
  }

  absl::Status Delete(const std::string& url, absl::Time /*deadline*/) override {
    CKPT_ASSIGN_OR_RETURN(std::string path, FileStorePath(url));
    CKPT_ASSIGN_OR_RETURN(ReplaceTarget target, CheckReplaceable(path));
    if (!target.exists) {
      return absl::NotFoundError(absl::StrCat("no checkpoint is committed at ", url));
    }
    // Renamed away first, so the path never shows a half-removed checkpoint.
    return DiscardStagingDir(path);
  }
};

CheckpointStoreRegistration file_registration("file", []() { return MakeFileStore(); });

}  // namespace

absl::StatusOr<std::string> FileStorePath(absl::string_view url) {
  const std::string scheme = StoreScheme(url);
  if (scheme != "file") {
    return absl::InvalidArgumentError(
        absl::StrCat(url, " is not a filesystem path (its scheme is ", scheme, ")"));
  }
  absl::string_view path = url;
  if (absl::StartsWith(url, kFilePrefix)) {
    path.remove_prefix(kFilePrefix.size());
    if (!absl::StartsWith(path, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(url, ": a file:// URL must name an absolute path with no host"));
    }
  }
  if (path.empty()) return absl::InvalidArgumentError("empty checkpoint path");
  return std::string(path);
}

std::unique_ptr<CheckpointStore> MakeFileStore() { return std::make_unique<FileStore>(); }

}  // namespace ckpt
