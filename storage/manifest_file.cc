#include "storage/manifest_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"

namespace ckpt {
namespace {

// Bytes buffered between write(2) calls.
constexpr int kWriteBufferBytes = 1 << 20;

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

}  // namespace

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
