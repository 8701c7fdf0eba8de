#include "storage/overwrite_guard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"

namespace ckpt {
namespace {

constexpr char kManifestName[] = "manifest.pb";
constexpr char kDataDirName[] = "data";

absl::Status Refuse(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("refusing to overwrite ", path, ": it is ", what,
                   "; overwriting replaces only a committed ckpt checkpoint (remove it yourself "
                   "or choose another destination)"));
}

// "a regular file", "a FIFO", ... for anything that is not a directory.
std::string KindOf(const std::string& path, const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "a regular file, not a ckpt checkpoint";
  if (S_ISLNK(st.st_mode)) {
    std::string target(4096, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    target.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return absl::StrCat("a symbolic link (to \"", target,
                        "\"); links are never followed or replaced");
  }
  if (S_ISFIFO(st.st_mode)) return "a FIFO, not a ckpt checkpoint";
  if (S_ISSOCK(st.st_mode)) return "a socket, not a ckpt checkpoint";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device, not a ckpt checkpoint";
  return "not a directory";
}

// The directory's manifest head (without pieces), if it has a manifest.pb that is a regular
// file and a manifest that parses and validates (streamed: its pieces are never all in memory).
absl::StatusOr<pb::Manifest> ManifestOf(const std::string& path,
                                        const std::vector<std::string>& names) {
  bool has_manifest = false, has_data = false;
  for (const std::string& n : names) {
    has_manifest |= n == kManifestName;
    has_data |= n == kDataDirName;
  }
  if (!has_manifest) {
    if (names.empty()) return Refuse(path, "an empty directory, not a ckpt checkpoint");
    if (has_data) {
      return Refuse(path,
                    "an incomplete checkpoint (data/ but no manifest.pb: a write that never "
                    "committed)");
    }
    return Refuse(path, "a directory that is not a ckpt checkpoint (no manifest.pb)");
  }
  const std::string manifest_path = JoinPath(path, kManifestName);
  struct stat st;
  if (::lstat(manifest_path.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat ", manifest_path));
  }
  if (!S_ISREG(st.st_mode)) {
    return Refuse(path, "a directory whose manifest.pb is not a regular file");
  }
  absl::StatusOr<pb::Manifest> manifest =
      StreamManifestFile(path, [](int64_t, pb::StoredPiece&) { return absl::OkStatus(); });
  if (manifest.ok()) return manifest;
  // manifest.pb is there: a piece file missing (NotFound) makes the checkpoint invalid too.
  const absl::StatusCode code = manifest.status().code();
  if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kUnimplemented &&
      code != absl::StatusCode::kNotFound) {
    return Refuse(path, absl::StrCat("unreadable: ", manifest.status().message()));
  }
  return Refuse(path, absl::StrCat("an invalid checkpoint: ", manifest.status().message()));
}

// Whether `path` is a regular file (not a link to one).
bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Everything in the checkpoint directory must belong to the checkpoint: manifest.pb, data/
// and the manifest's piece files (regular files) at the top, and in data/ only regular files
// the manifest lists.
absl::Status CheckOnlyCheckpointFiles(const std::string& path,
                                      const std::vector<std::string>& names,
                                      const pb::Manifest& manifest) {  // its head suffices
  std::set<std::string> piece_files;
  for (const pb::ManifestPieceFile& f : manifest.piece_files()) piece_files.insert(f.name());
  std::vector<std::string> foreign;
  for (const std::string& n : names) {
    if (n == kManifestName || n == kDataDirName) continue;
    if (piece_files.count(n) == 0 || !IsRegularFile(JoinPath(path, n))) foreign.push_back(n);
  }
  std::set<std::string> listed;
  for (const pb::DataFile& f : manifest.files()) listed.insert(f.name());
  const std::string data = JoinPath(path, kDataDirName);
  struct stat st;
  if (::lstat(data.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      foreign.push_back("data (not a directory)");
    } else {
      CKPT_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDir(data));
      for (const std::string& f : files) {
        const std::string name = absl::StrCat(kDataDirName, "/", f);
        if (!IsRegularFile(JoinPath(data, f)) || listed.count(name) == 0) foreign.push_back(name);
      }
    }
  } else if (!listed.empty()) {
    return Refuse(path, "an invalid checkpoint: its manifest lists data files but it has no data/");
  }
  if (foreign.empty()) return absl::OkStatus();
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(foreign.begin(),
                                 foreign.begin() + std::min(foreign.size(), kShown));
  return Refuse(path,
                absl::StrCat("a checkpoint directory that also holds ", absl::StrJoin(shown, ", "),
                             foreign.size() > kShown ? ", ..." : "",
                             " (not part of the checkpoint; it would be deleted)"));
}

}  // namespace

absl::StatusOr<ReplaceTarget> CheckReplaceable(const std::string& path) {
  ReplaceTarget target;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return target;
    return ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISDIR(st.st_mode)) return Refuse(path, KindOf(path, st));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ManifestOf(path, names));
  CKPT_RETURN_IF_ERROR(CheckOnlyCheckpointFiles(path, names, manifest));
  target.exists = true;
  target.device = st.st_dev;
  target.inode = st.st_ino;
  return target;
}

bool IsSameTarget(const std::string& path, const ReplaceTarget& target) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return false;
  return S_ISDIR(st.st_mode) && st.st_dev == target.device && st.st_ino == target.inode;
}

}  // namespace ckpt
