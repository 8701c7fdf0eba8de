// `ckptctl gc [--dry-run] DIR...`: finds the staging directories that interrupted checkpoint
// writes left next to their final paths (".<name>.tmp-<pid>-<n>", and ".discard-" renames of
// them) in each DIR, and removes the incomplete ones, printing each with its size. Complete
// checkpoints under a staging name are kept and reported; directories that only look like
// staging directories are refused; those whose writer pid is alive on this host are skipped.
// `ckptctl gc [--dry-run] [--min-age DURATION] s3://bucket/prefix`: what crashed writers left in
// an object store (storage/s3_gc.h), with the client from the AWS environment.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/staging_journal.h"
#include "storage/file_util.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3_gc.h"
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

// One s3 leftover, as removed (or to remove, with dry_run).
void PrintS3Leftover(const S3GcLeftover& l, bool dry_run) {
  const bool upload = l.kind == S3GcLeftover::Kind::kUpload;
  const std::string what =
      upload
          ? absl::StrCat("multipart upload ", l.url, " (upload id ", l.upload_id, ", begun ",
                         absl::FormatTime(absl::RFC3339_sec, l.newest, absl::UTCTimeZone()),
                         ", part sizes not listed)")
          : absl::StrCat(l.url, " (", HumanBytes(l.bytes), " in ", l.objects,
                         l.objects == 1 ? " object" : " objects", ", newest ",
                         absl::FormatTime(absl::RFC3339_sec, l.newest, absl::UTCTimeZone()), ")");
  if (!l.error.empty()) {
    std::fprintf(stderr, "ckptctl gc: %s: %s\n", what.c_str(), l.error.c_str());
    return;
  }
  std::printf("%s %s: %s\n", dry_run ? "would remove" : "removed", what.c_str(), l.reason.c_str());
}

// `ckptctl gc s3://...`: exit code 1 when a listing failed or a removal did.
int RunS3Gc(const std::vector<std::string>& urls, bool dry_run, absl::Duration min_age,
            absl::Duration timeout) {
  absl::StatusOr<S3Settings> settings = LoadS3SettingsFromEnvironment();
  if (!settings.ok()) return Fail("gc", settings.status());
  absl::StatusOr<std::unique_ptr<S3Client>> client =
      S3Client::Create(S3ClientOptionsFrom(*settings));
  if (!client.ok()) return Fail("gc", client.status());
  const absl::Time deadline = absl::Now() + timeout;
  int removed = 0, failed = 0, young = 0, committed = 0;
  int64_t bytes = 0;
  for (const std::string& url : urls) {
    absl::StatusOr<S3GcReport> report = CollectS3Garbage(**client, url, min_age, dry_run, deadline);
    if (!report.ok()) {
      std::fprintf(stderr, "ckptctl gc: %s\n", std::string(report.status().message()).c_str());
      ++failed;
      continue;
    }
    for (const S3GcLeftover& l : report->leftovers) {
      PrintS3Leftover(l, dry_run);
      if (!l.error.empty()) continue;
      ++removed;
      if (l.bytes > 0) bytes += l.bytes;
    }
    for (const std::string& u : report->unreadable) {
      std::printf("left alone %s (its manifest cannot be read)\n", u.c_str());
    }
    failed += report->failed();
    young += report->young;
    committed += report->committed;
  }
  std::printf("gc: %d %s (%s), %d committed generations kept, %d younger than %s left%s\n", removed,
              dry_run ? "to remove" : "removed", HumanBytes(bytes).c_str(), committed, young,
              absl::FormatDuration(min_age).c_str(),
              failed > 0 ? absl::StrCat(", ", failed, " failed").c_str() : "");
  return failed > 0 ? 1 : 0;
}

// --min-age: a duration with its unit, 0 allowed (default 1h).
absl::Status MinAgeFlag(const ParsedArgs& a, absl::Duration* out) {
  *out = absl::Hours(1);
  if (!a.Has("min-age")) return absl::OkStatus();
  const std::string v = a.Get("min-age");
  if (!absl::ParseDuration(v, out) || *out < absl::ZeroDuration() ||
      *out == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-age ", v, ": expected a duration such as 0, 30m or 2h"));
  }
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& GcSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "gc",
      "usage: ckptctl gc [--dry-run] DIR...\n"
      "       ckptctl gc [--dry-run] [--min-age DURATION] [--timeout DURATION] "
      "s3://BUCKET[/PREFIX]...",
      "Removes the staging directories that interrupted checkpoint writes (a crashed coordinator,\n"
      "worker or ckptctl) left in each DIR: entries named .<name>.tmp-<pid>-<n> that hold only\n"
      "data/r<rank>_<n>.safetensors files and no committed manifest. Each is printed with its\n"
      "size. A DIR that is itself such a directory is looked at alone. Kept and reported:\n"
      "complete checkpoints under a staging name (an interrupted commit). Refused: anything else\n"
      "with such a name. Skipped: directories whose writer pid is alive on this host (a write in\n"
      "progress; on a shared filesystem, run gc only when no save or reshard is running\n"
      "elsewhere). Exit code 1 when a DIR is unusable or a removal failed.\n"
      "\n"
      "With s3:// URLs (credentials, region and endpoint from the AWS environment), removes what\n"
      "crashed writers left under each prefix: multipart uploads never completed (aborted), and\n"
      "generation prefixes <name>/g<16 hex>/ that the manifest committed at <name> does not name\n"
      "(or under a name with no manifest), each printed with its size. Never touched: the\n"
      "generation a committed manifest names, names whose manifest cannot be read, and anything\n"
      "younger than --min-age (a write in progress). A write whose objects gc removed fails its\n"
      "commit; nothing committed is ever corrupted. Exit code 1 when a listing or removal "
      "failed.\n",
      {{"dry-run", "", "list what would be removed without removing it"},
       {"min-age", "DURATION",
        "s3 only: leave leftovers younger than this (default 1h);\n"
        "0 takes all, for when no write is running"},
       {"timeout", "DURATION", "s3 only: deadline of the whole gc (default 10m)"}}};
  return *spec;
}

int RunGcCommand(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(GcSpec(), args, &a)) return *code;
  const bool dry_run = a.Has("dry-run");
  const std::vector<std::string>& dirs = a.positional;
  if (dirs.empty()) return Usage("gc", "name at least one directory");
  const int s3_urls = static_cast<int>(std::count_if(
      dirs.begin(), dirs.end(), [](const std::string& d) { return absl::StartsWith(d, "s3://"); }));
  if (s3_urls > 0) {
    if (s3_urls != static_cast<int>(dirs.size())) {
      return Usage("gc", "name either directories or s3:// URLs, not both");
    }
    absl::Duration min_age, timeout = absl::Minutes(10);
    for (const absl::Status& s :
         {MinAgeFlag(a, &min_age),
          a.Has("timeout") ? DurationFlag(a, "timeout", &timeout) : absl::OkStatus()}) {
      if (!s.ok()) return Usage("gc", std::string(s.message()));
    }
    return RunS3Gc(dirs, dry_run, min_age, timeout);
  }
  if (a.Has("min-age") || a.Has("timeout")) {
    return Usage("gc", "--min-age and --timeout apply only to s3:// URLs");
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
              dry_run ? "to remove" : "removed", HumanBytes(tally.bytes_removed).c_str(),
              tally.kept, tally.skipped, tally.refused,
              tally.failed > 0 ? absl::StrCat(", ", tally.failed, " failed").c_str() : "");
  return tally.failed > 0 ? 1 : 0;
}

}  // namespace ckpt::ckptctl
