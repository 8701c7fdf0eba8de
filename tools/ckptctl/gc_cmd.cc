// `ckptctl gc [--dry-run] DIR...`: finds the staging directories that interrupted checkpoint
// writes left next to their final paths (".<name>.tmp-<pid>-<n>", and ".discard-" renames of
// them) in each DIR, and removes the incomplete ones, printing each with its size. Complete
// checkpoints under a staging name are kept and reported; directories that only look like
// staging directories are refused; those whose writer pid is alive on this host are skipped.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/staging_journal.h"
#include "storage/file_util.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {
namespace {

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
    std::printf("kept %s (%s): %s\n", l.path.c_str(), HumanBytes(l.bytes).c_str(),
                l.detail.c_str());
    ++tally->kept;
  } else if (PidAlive(l.writer_pid)) {
    std::printf(
        "skipped %s (%s): its writer, pid %d, is alive on this host (a write in progress?)\n",
        l.path.c_str(), HumanBytes(l.bytes).c_str(), static_cast<int>(l.writer_pid));
    ++tally->skipped;
  } else if (dry_run) {
    std::printf("would remove %s (%s): %s\n", l.path.c_str(), HumanBytes(l.bytes).c_str(),
                l.detail.c_str());
    ++tally->removed;
    tally->bytes_removed += l.bytes;
  } else if (absl::Status s = coordinator::RemoveStagingLeftover(l); !s.ok()) {
    std::fprintf(stderr, "ckptctl gc: %s\n", std::string(s.message()).c_str());
    ++tally->failed;
  } else {
    std::printf("removed %s (%s): %s\n", l.path.c_str(), HumanBytes(l.bytes).c_str(),
                l.detail.c_str());
    ++tally->removed;
    tally->bytes_removed += l.bytes;
  }
}

}  // namespace

const CommandSpec& GcSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "gc",
      "usage: ckptctl gc [--dry-run] DIR...",
      "Removes the staging directories that interrupted checkpoint writes (a crashed coordinator,\n"
      "worker or ckptctl) left in each DIR: entries named .<name>.tmp-<pid>-<n> that hold only\n"
      "data/r<rank>_<n>.safetensors files and no committed manifest. Each is printed with its\n"
      "size. A DIR that is itself such a directory is looked at alone. Kept and reported:\n"
      "complete checkpoints under a staging name (an interrupted commit). Refused: anything else\n"
      "with such a name. Skipped: directories whose writer pid is alive on this host (a write in\n"
      "progress; on a shared filesystem, run gc only when no save or reshard is running\n"
      "elsewhere). Exit code 1 when a DIR is unusable or a removal failed.\n",
      {{"dry-run", "", "list what would be removed without removing it"}}};
  return *spec;
}

int RunGcCommand(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(GcSpec(), args, &a)) return *code;
  const bool dry_run = a.Has("dry-run");
  const std::vector<std::string>& dirs = a.positional;
  if (dirs.empty()) return Usage("gc", "name at least one directory");
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
              dry_run ? "to remove" : "removed", HumanBytes(tally.bytes_removed).c_str(),
              tally.kept, tally.skipped, tally.refused,
              tally.failed > 0 ? absl::StrCat(", ", tally.failed, " failed").c_str() : "");
  return tally.failed > 0 ? 1 : 0;
}

}  // namespace ckpt::ckptctl
