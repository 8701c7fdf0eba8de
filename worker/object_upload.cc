#include "worker/object_upload.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "common/status_macros.h"
#include "storage/checkpoint_store.h"
#include "storage/file_util.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kReadBytes = int64_t{8} << 20;  // one read of a local file, one Append

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Streams local file `path` (of `size` bytes) into `writer`.
absl::Status StreamFile(const std::string& path, int64_t size, ObjectWriter& writer,
                        const std::function<bool()>& cancelled) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::vector<char> buffer(static_cast<size_t>(std::min(size, kReadBytes)) + 1);
  int64_t done = 0;
  while (done < size) {
    if (cancelled && cancelled()) return absl::CancelledError("the operation was aborted");
    const size_t want = static_cast<size_t>(std::min(size - done, kReadBytes));
    const ssize_t n = ::pread(file.fd, buffer.data(), want, done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path));
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, " ends at byte ", done, "; the rank wrote ", size));
    }
    CKPT_RETURN_IF_ERROR(writer.Append(absl::string_view(buffer.data(), n)));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScratchDir> ScratchDir::Create(const std::string& root, const std::string& who) {
  std::string base = root;
  if (base.empty()) {
    const char* tmp = ::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = JoinPath(base, absl::StrCat("ckpt-upload-", who, "-XXXXXX"));
  if (::mkdtemp(pattern.data()) == nullptr) {
    return ErrnoStatus(errno,
                       absl::StrCat("making a scratch directory for the upload under ", base));
  }
  ScratchDir scratch(std::move(pattern));
  // As a staging directory: the data files go under data/.
  CKPT_RETURN_IF_ERROR(MakeDir(JoinPath(scratch.path(), "data")));
  return scratch;
}

ScratchDir::~ScratchDir() {
  if (!path_.empty()) RemoveTree(path_).IgnoreError();  // a scratch directory this made
}

// Weak: the testonly worker/test_hooks_on.cc replaces it (see object_upload.h).
ABSL_ATTRIBUTE_WEAK bool PassUploadGateForTest(const std::function<bool()>& /*cancelled*/) {
  return true;
}

absl::Status UploadDataFiles(const std::string& dir, const pb::Manifest& written,
                             const std::string& staging_url, absl::Time deadline,
                             const std::function<bool()>& cancelled, const std::string& who) {
  auto failed = [&](const std::string& object, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(who, ": uploading ", object, " to ", staging_url,
                                               ": ", s.message()));
  };
  if (!PassUploadGateForTest(cancelled)) {
    return failed("its data files", absl::CancelledError("the operation was aborted"));
  }
  absl::StatusOr<CheckpointStore*> store = StoreForUrl(staging_url);
  if (!store.ok()) return failed("its data files", store.status());
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      (*store)->JoinWrite(staging_url, deadline);
  if (!write.ok()) return failed("its data files", write.status());
  for (const pb::DataFile& file : written.files()) {
    absl::StatusOr<std::unique_ptr<ObjectWriter>> writer = (*write)->Create(file.name());
    if (!writer.ok()) return failed(file.name(), writer.status());
    absl::Status s = StreamFile(JoinPath(dir, file.name()), file.size_bytes(), **writer, cancelled);
    if (s.ok()) s = (*writer)->Close(deadline);
    if (!s.ok()) return failed(file.name(), s);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
