// `ckptctl gc [--dry_run] DIR...`: finds the staging directories that interrupted checkpoint
// writes left next to their final paths (".<name>.tmp-<pid>-<n>", and ".discard-" renames of
// them) in each DIR, and removes the incomplete ones, printing each with its size. Complete
// checkpoints under a staging name are kept and reported; directories that only look like
// staging directories are refused; those whose writer pid is alive on this host are skipped.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/staging_journal.h"
#include "storage/file_util.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kUsage[] =
    "usage: ckptctl gc [--dry_run] DIR...\n\n"
    "Removes the staging directories that interrupted checkpoint writes (a crashed coordinator,\n"
    "worker or ckptctl) left in each DIR: entries named .<name>.tmp-<pid>-<n> that hold only\n"
    "data/r<rank>_<n>.safetensors files and no committed manifest. Each is printed with its size.\n"
    "A DIR that is itself such a directory is looked at alone. Kept and reported: complete\n"
    "checkpoints under a staging name (an interrupted commit). Refused: anything else with such\n"
    "a name. Skipped: directories whose writer pid is alive on this host (a write in progress;\n"
    "on a shared filesystem, run gc only when no save or reshard is running elsewhere).\n"
    "--dry_run lists without removing. Exit code 1 when a DIR is unusable or a removal failed.\n";

std::string Bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

bool PidAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// Totals over every DIR.
struct Tally {
  int removed = 0, kept = 0, skipped = 0, refused = 0, failed = 0;
  int64_t bytes_removed = 0;
};

void Handle(const coordinator::StagingLeftover& l, bool dry_run, Tally* tally) {
  using coordinator::LeftoverKind;
  if (l.kind == LeftoverKind::kNotStaging) {
    std::printf("refused %s: %s\n", l.path.c_str(), l.detail.c_str());
    ++tally->refused;
  } else if (l.kind == LeftoverKind::kComplete) {
    std::printf("kept %s (%s): %s\n", l.path.c_str(), Bytes(l.bytes).c_str(), l.detail.c_str());
    ++tally->kept;
  } else if (PidAlive(l.writer_pid)) {
    std::printf(
        "skipped %s (%s): its writer, pid %d, is alive on this host (a write in progress?)\n",
        l.path.c_str(), Bytes(l.bytes).c_str(), static_cast<int>(l.writer_pid));
    ++tally->skipped;
  } else if (dry_run) {
    std::printf("would remove %s (%s): %s\n", l.path.c_str(), Bytes(l.bytes).c_str(),
                l.detail.c_str());
    ++tally->removed;
    tally->bytes_removed += l.bytes;
  } else if (absl::Status s = coordinator::RemoveStagingLeftover(l); !s.ok()) {
    std::fprintf(stderr, "ckptctl gc: %s\n", std::string(s.message()).c_str());
    ++tally->failed;
  } else {
    std::printf("removed %s (%s): %s\n", l.path.c_str(), Bytes(l.bytes).c_str(), l.detail.c_str());
    ++tally->removed;
    tally->bytes_removed += l.bytes;
  }
}

}  // namespace

int RunGcCommand(const std::vector<std::string>& args) {
  bool dry_run = false;
  std::vector<std::string> dirs;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (args[i] == "--dry_run" || args[i] == "--dry-run") {
      dry_run = true;
    } else if (!args[i].empty() && args[i][0] == '-') {
      std::fprintf(stderr, "ckptctl gc: unknown flag %s\n%s", args[i].c_str(), kUsage);
      return 2;
    } else {
      dirs.push_back(args[i]);
    }
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "ckptctl gc: name at least one directory\n%s", kUsage);
    return 2;
  }
  Tally tally;
  for (const std::string& dir : dirs) {
    if (coordinator::IsStagingName(BaseName(dir))) {
      Handle(coordinator::InspectStagingDir(dir), dry_run, &tally);
      continue;
    }
    absl::StatusOr<std::vector<coordinator::StagingLeftover>> found =
        coordinator::FindStagingLeftovers(dir);
    if (!found.ok()) {
      std::fprintf(stderr, "ckptctl gc: %s: %s\n", dir.c_str(),
                   std::string(found.status().message()).c_str());
      ++tally.failed;
      continue;
    }
    for (const coordinator::StagingLeftover& l : *found) Handle(l, dry_run, &tally);
  }
  std::printf("gc: %d %s (%s), %d kept, %d skipped, %d refused%s\n", tally.removed,
              dry_run ? "to remove" : "removed", Bytes(tally.bytes_removed).c_str(), tally.kept,
              tally.skipped, tally.refused,
              tally.failed > 0 ? absl::StrCat(", ", tally.failed, " failed").c_str() : "");
  return tally.failed > 0 ? 1 : 0;
}

}  // namespace ckpt::ckptctl
