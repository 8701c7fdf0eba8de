#include "storage/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/store_url.h"
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

// The size of regular file `file` of checkpoint `url` (NotFound naming both when it is
// missing; FailedPrecondition for anything but a regular file, a symlink included).
absl::StatusOr<int64_t> StagedFileSize(const std::string& url, const std::string& file) {
  struct stat st;
  if (::lstat(file.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", url, ": ", file, " is not in the staging directory"));
    }
    return ErrnoStatus(errno, absl::StrCat("stat ", file, " of ", url));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", url, ": ", file, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

// A checkpoint directory being written in its staging sibling; or, joined (JoinWrite), another
// process's part of such a write, which only adds files to the staging directory.
class FileWrite final : public CheckpointWrite {
 public:
  FileWrite(std::string url, std::string path, std::string staging, bool overwrite, bool joined)
      : CheckpointWrite(std::move(url), joined),
        path_(std::move(path)),
        staging_(std::move(staging)),
        overwrite_(overwrite) {}
  ~FileWrite() override {
    if (done_) return;
    if (joined()) {
      (void)RemoveOwn(UnclosedObjects());
    } else {
      (void)DiscardStagingDir(staging_);
    }
  }

  std::string staging_url() const override { return staging_; }

 protected:
  absl::StatusOr<std::unique_ptr<ObjectWriter>> CreateObject(const std::string& name) override {
    const std::string file = JoinPath(staging_, name);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", file, " of ", url()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      created_.push_back(name);
    }
    return std::unique_ptr<ObjectWriter>(std::make_unique<FileObjectWriter>(
        fd, file, name,
        [this](const std::string& object, int64_t size) { RecordClosed(object, size); }));
  }

  absl::StatusOr<int64_t> StagedObjectSize(const std::string& name,
                                           absl::Time /*deadline*/) override {
    return StagedFileSize(url(), JoinPath(staging_, name));
  }

  absl::Status CommitManifest(const pb::Manifest& manifest, absl::Time /*deadline*/) override {
    if (done_) return absl::FailedPreconditionError(absl::StrCat(url(), ": write already ended"));
    // Adopted files were written by other processes: each is checked again right before the
    // commit (one a joined write removed since it was adopted fails here, naming it).
    for (const pb::DataFile& file : manifest.files()) {
      absl::StatusOr<int64_t> size = StagedFileSize(url(), JoinPath(staging_, file.name()));
      if (!size.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(size.status().message(), " (removed since it was adopted?)"));
      }
      if (*size != file.size_bytes()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint ", url(), ": data file ", file.name(), " holds ", *size,
                         " bytes but the manifest records ", file.size_bytes()));
      }
    }
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
    if (!joined()) return DiscardStagingDir(staging_);
    std::vector<std::string> created;
    {
      std::lock_guard<std::mutex> lock(mu_);
      created = created_;
    }
    return RemoveOwn(created);
  }

 private:
  // Removes the named files this write created (gone already is fine: the beginning write
  // may have discarded or committed the staging directory).
  absl::Status RemoveOwn(const std::vector<std::string>& names) {
    absl::Status first;
    for (const std::string& name : names) {
      const std::string file = JoinPath(staging_, name);
      if (::unlink(file.c_str()) != 0 && errno != ENOENT && first.ok()) {
        first = ErrnoStatus(errno, absl::StrCat("remove ", file, " of ", url()));
      }
    }
    return first;
  }

  const std::string path_;
  const std::string staging_;
  const bool overwrite_;
  bool done_ = false;
  std::mutex mu_;
  std::vector<std::string> created_;  // names this write created
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

// `path` with every symlink, "." and ".." resolved (realpath(3)); NotFound when it is missing.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return ErrnoStatus(errno, absl::StrCat("resolve ", path));
  }
  return std::string(resolved);
}

// true for 1-10 ASCII digits (a pid or counter of a staging directory's name).
bool IsDecimal(absl::string_view s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The checkpoint path whose staging directory `staging` names, when `staging` is spelled
// exactly as BeginWrite's staging_url spells one: an absolute, normalised path (no empty, "."
// or ".." components, no trailing '/', no control characters) whose last component is
// ".<name>.tmp-<pid>-<counter>" (CreateStagingDir's sibling); the checkpoint is <parent>/<name>.
// InvalidArgument naming `staging` and the rule it breaks otherwise.
absl::StatusOr<std::string> CheckpointOfStagingPath(const std::string& staging) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", absl::CHexEscape(staging), "\" is not the staging directory of a checkpoint: ", why));
  };
  if (staging.size() < 2 || staging[0] != '/') return refuse("not an absolute path");
  for (char c : staging) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return refuse("a control character");
  }
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(staging).substr(1), '/');
  for (absl::string_view part : parts) {
    if (part.empty() || part == "." || part == "..") {
      return refuse("an empty, \".\" or \"..\" component");
    }
  }
  absl::string_view base = parts.back();
  const size_t tag = base.rfind(".tmp-");
  if (base[0] != '.' || tag == absl::string_view::npos || tag < 2) {
    return refuse("its name is not .<checkpoint>.tmp-<pid>-<n>");
  }
  const absl::string_view name = base.substr(1, tag - 1);
  const std::vector<absl::string_view> numbers = absl::StrSplit(base.substr(tag + 5), '-');
  if (numbers.size() != 2 || !IsDecimal(numbers[0]) || !IsDecimal(numbers[1]) || name == "." ||
      name == "..") {
    return refuse("its name is not .<checkpoint>.tmp-<pid>-<n>");
  }
  const std::string parent = staging.substr(0, staging.size() - base.size() - 1);
  return JoinPath(parent.empty() ? "/" : parent, name);
}

// The joined write of the staging directory `staging` (see CheckpointOfStagingPath).
absl::StatusOr<std::unique_ptr<CheckpointWrite>> JoinStagingDir(const std::string& staging) {
  CKPT_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointOfStagingPath(staging));
  absl::StatusOr<std::string> real = RealPath(staging);
  if (absl::IsNotFound(real.status())) {
    return absl::NotFoundError(
        absl::StrCat("staging directory ", staging, " of checkpoint ", checkpoint,
                     " is gone: its write was aborted or committed, or never begun"));
  }
  if (!real.ok()) return real.status();
  struct stat st;
  if (*real != staging || ::lstat(JoinPath(staging, "data").c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        staging, " is not the staging directory of a checkpoint: ",
        *real != staging ? absl::StrCat("it resolves to ", *real) : "it has no data/ directory"));
  }
  return std::unique_ptr<CheckpointWrite>(std::make_unique<FileWrite>(
      checkpoint, checkpoint, staging, /*overwrite=*/false, /*joined=*/true));
}

class FileStore final : public CheckpointStore {
 public:
  absl::string_view scheme() const override { return "file"; }

  absl::StatusOr<std::unique_ptr<CheckpointWrite>> BeginWrite(const std::string& url,
                                                              const StoreWriteOptions& options,
                                                              absl::Time /*deadline*/) override {
    CKPT_ASSIGN_OR_RETURN(std::string path, FileStorePath(url));
    CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(path, options.overwrite));
    // Absolute and resolved, so it is what JoinWrite accepts from any working directory.
    absl::StatusOr<std::string> real = RealPath(staging);
    if (!real.ok()) {
      (void)DiscardStagingDir(staging);
      return real.status();
    }
    return std::unique_ptr<CheckpointWrite>(std::make_unique<FileWrite>(
        url, std::move(path), *std::move(real), options.overwrite, /*joined=*/false));
  }

  absl::StatusOr<std::unique_ptr<CheckpointWrite>> JoinWrite(const std::string& staging_url,
                                                             absl::Time /*deadline*/) override {
    return JoinStagingDir(staging_url);
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
  const std::string scheme = LocationScheme(url);
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
