#include "coordinator/staging_journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"

namespace ckpt::coordinator {
namespace {

constexpr char kManifestName[] = "manifest.pb";
constexpr char kManifestTempName[] = "manifest.pb.tmp";

// Splits "<rest>.<tag>-<pid>-<n>" into rest and pid; false when `name` has another form.
bool SplitTagged(const std::string& name, absl::string_view tag, std::string* rest, pid_t* pid) {
  const std::string marker = absl::StrCat(".", tag, "-");
  const size_t at = name.rfind(marker);
  if (at == std::string::npos || at == 0) return false;
  std::vector<std::string> numbers = absl::StrSplit(name.substr(at + marker.size()), '-');
  int64_t p = 0, n = 0;
  if (numbers.size() != 2 || !absl::SimpleAtoi(numbers[0], &p) ||
      !absl::SimpleAtoi(numbers[1], &n) || p <= 0 || n < 0 || !absl::ascii_isdigit(numbers[0][0]) ||
      !absl::ascii_isdigit(numbers[1][0])) {
    return false;
  }
  *rest = name.substr(0, at);
  *pid = static_cast<pid_t>(p);
  return true;
}

// lstat: the kind of `path` without following a symlink; false when it does not exist.
bool LStat(const std::string& path, struct stat* st) { return ::lstat(path.c_str(), st) == 0; }

// Checks the entries of a staging directory; adds the file sizes to `bytes`. Empty when
// every entry is one a ckpt write creates, else what is wrong. Walks by file descriptor, never
// following a symlink, so a directory swapped meanwhile cannot make it count another's files.
std::string CheckContents(const std::string& path, int64_t* bytes, bool* has_manifest) {
  absl::StatusOr<DirListing> listing = ListDirNoFollow(path);
  if (!listing.ok()) return std::string(listing.status().message());
  for (const DirEntryStat& entry : listing->entries) {
    const std::string& name = entry.name;
    if (name == "data" && S_ISDIR(entry.mode)) {
      absl::StatusOr<DirListing> files = ListDirNoFollow(JoinPath(path, name));
      if (!files.ok()) return std::string(files.status().message());
      if (files->self.dev != entry.dev || files->self.ino != entry.ino) {
        return "has a data/ that was replaced while being looked at";
      }
      for (const DirEntryStat& file : files->entries) {
        if (!S_ISREG(file.mode) || !ValidateDataFileName(absl::StrCat("data/", file.name)).ok()) {
          return absl::StrCat("holds data/", file.name, ", which no ckpt write creates");
        }
        *bytes += file.size;
      }
      continue;
    }
    if ((name == kManifestName || name == kManifestTempName || IsManifestPieceFileName(name)) &&
        S_ISREG(entry.mode)) {
      *bytes += entry.size;
      if (name == kManifestName) *has_manifest = true;
      continue;
    }
    return absl::StrCat("holds ", name, ", which no ckpt write creates");
  }
  return "";
}

// Reads a journal record: "<pid>\n<final path>\n".
bool ParseRecord(const std::string& text, pid_t* pid, std::string* final_path) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  int64_t p = 0;
  if (lines.size() != 2 || !absl::SimpleAtoi(lines[0], &p) || p <= 0 || lines[1].empty()) {
    return false;
  }
  *pid = static_cast<pid_t>(p);
  *final_path = lines[1];
  return true;
}

}  // namespace

bool IsStagingName(const std::string& name, pid_t* writer_pid) {
  std::string rest;
  pid_t pid = 0, ignored = 0;
  // An aborted write's staging directory renamed aside: ".<staging name>.discard-<pid>-<n>".
  std::string staging;
  if (SplitTagged(name, "discard", &staging, &ignored)) {
    if (staging.size() < 2 || staging[0] != '.') return false;
    return IsStagingName(staging.substr(1), writer_pid);
  }
  if (name.size() < 2 || name[0] != '.' || !SplitTagged(name, "tmp", &rest, &pid)) return false;
  if (rest.size() < 2) return false;  // "." + a non-empty checkpoint name
  if (writer_pid != nullptr) *writer_pid = pid;
  return true;
}

StagingLeftover InspectStagingDir(const std::string& path) {
  StagingLeftover out;
  out.path = path;
  if (!IsStagingName(BaseName(path), &out.writer_pid)) {
    out.detail = "not named like a ckpt staging directory (.<name>.tmp-<pid>-<n>)";
    return out;
  }
  struct stat st;
  if (!LStat(path, &st)) {
    out.detail = "does not exist";
    return out;
  }
  if (!S_ISDIR(st.st_mode)) {
    out.detail =
        S_ISLNK(st.st_mode) ? "is a symbolic link, not a staging directory" : "is not a directory";
    return out;
  }
  bool has_manifest = false;
  std::string problem = CheckContents(path, &out.bytes, &has_manifest);
  if (!problem.empty()) {
    out.detail = absl::StrCat("not a ckpt staging directory: it ", problem);
    return out;
  }
  if (has_manifest) {
    out.kind = LeftoverKind::kComplete;
    out.detail =
        "holds a committed manifest: a complete checkpoint under a staging name (an interrupted "
        "commit or overwrite); inspect it, then rename or remove it by hand";
    return out;
  }
  out.kind = LeftoverKind::kIncomplete;
  out.detail = "an interrupted write's staging directory (no manifest)";
  return out;
}

absl::StatusOr<std::vector<StagingLeftover>> FindStagingLeftovers(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir);
  if (!names.ok()) return names.status();
  std::vector<StagingLeftover> out;
  for (const std::string& name : *names) {
    if (IsStagingName(name)) out.push_back(InspectStagingDir(JoinPath(dir, name)));
  }
  return out;
}

absl::Status RemoveStagingLeftover(const StagingLeftover& leftover) {
  // Looked at again right before: only what is (still) an incomplete staging directory goes.
  StagingLeftover now = InspectStagingDir(leftover.path);
  if (now.kind != LeftoverKind::kIncomplete) {
    return absl::FailedPreconditionError(
        absl::StrCat("not removing ", leftover.path, ": ", now.detail));
  }
  return DiscardStagingDir(leftover.path);
}

absl::StatusOr<std::unique_ptr<StagingJournal>> StagingJournal::Open(const std::string& state_dir) {
  if (state_dir.empty()) return absl::InvalidArgumentError("empty state directory");
  if (absl::Status s = MakeDir(state_dir, /*exist_ok=*/true); !s.ok()) return s;
  const std::string dir = JoinPath(state_dir, "staging");
  if (absl::Status s = MakeDir(dir, /*exist_ok=*/true); !s.ok()) return s;
  const std::string lock_path = JoinPath(state_dir, "lock");
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", lock_path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return ErrnoStatus(err, absl::StrCat("lock ", lock_path));
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", state_dir, " is in use by another coordinator (pid ",
                     n > 0 ? std::string(absl::StripAsciiWhitespace(pid)) : "?", ")"));
  }
  const std::string me = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("write ", lock_path));
  }
  return std::unique_ptr<StagingJournal>(new StagingJournal(dir, fd));
}

StagingJournal::~StagingJournal() { ::close(lock_fd_); }

std::string StagingJournal::EntryPath(const std::string& operation_id) const {
  return JoinPath(dir_, operation_id);
}

absl::Status StagingJournal::Begin(const std::string& operation_id, const std::string& final_path) {
  if (operation_id.empty() || absl::StrContains(operation_id, '/') || operation_id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("bad operation id \"", operation_id, "\""));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string entry = EntryPath(operation_id);
  const std::string tmp = absl::StrCat(entry, ".tmp");
  if (absl::Status s = WriteFileDurably(tmp, absl::StrCat(::getpid(), "\n", final_path, "\n"));
      !s.ok()) {
    return s;
  }
  if (::rename(tmp.c_str(), entry.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", entry));
  }
  return FsyncDir(dir_);
}

absl::Status StagingJournal::End(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string entry = EntryPath(operation_id);
  if (::unlink(entry.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("unlink ", entry));
  }
  return FsyncDir(dir_);
}

std::vector<StagingLeftover> StagingJournal::Recover() {
  std::vector<StagingLeftover> found;
  absl::StatusOr<std::vector<std::string>> entries = ListDir(dir_);
  if (!entries.ok()) {
    StagingLeftover failed;
    failed.path = dir_;
    failed.detail = std::string(entries.status().message());
    return {failed};
  }
  for (const std::string& entry : *entries) {
    const std::string path = JoinPath(dir_, entry);
    absl::StatusOr<std::string> text = ReadWholeFile(path, 1 << 16);
    pid_t pid = 0;
    std::string final_path;
    if (absl::EndsWith(entry, ".tmp") || !text.ok() || !ParseRecord(*text, &pid, &final_path)) {
      (void)::unlink(path.c_str());  // a record torn by the crash: its write had not begun
      continue;
    }
    const std::string parent = ParentDir(final_path);
    const std::string base = BaseName(final_path);
    absl::StatusOr<std::vector<std::string>> names = ListDir(parent);
    bool handled = names.ok() || !PathExists(parent);  // a parent that is gone holds nothing
    if (!handled) {
      StagingLeftover unlisted;
      unlisted.path = parent;
      unlisted.writer_pid = pid;
      unlisted.detail = absl::StrCat("cannot look for the staging directories of ", final_path,
                                     ": ", names.status().message());
      found.push_back(std::move(unlisted));
    }
    for (const std::string& name : names.ok() ? *names : std::vector<std::string>()) {
      pid_t writer = 0;
      const std::string staging_prefix = absl::StrCat(".", base, ".tmp-", pid, "-");
      if (!IsStagingName(name, &writer) || writer != pid ||
          !(absl::StartsWith(name, staging_prefix) ||
            absl::StartsWith(name, absl::StrCat(".", staging_prefix)))) {
        continue;
      }
      StagingLeftover leftover = InspectStagingDir(JoinPath(parent, name));
      if (leftover.kind == LeftoverKind::kIncomplete) {
        absl::Status s = RemoveStagingLeftover(leftover);
        leftover.removed = s.ok();
        if (!s.ok()) {
          leftover.detail = absl::StrCat("could not be removed: ", s.message());
          handled = false;
        }
      }
      found.push_back(std::move(leftover));
    }
    if (handled) (void)End(entry);
  }
  return found;
}

}  // namespace ckpt::coordinator
