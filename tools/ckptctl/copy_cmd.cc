// `ckptctl copy FROM TO`: copies a committed checkpoint between checkpoint stores by URL (a
// directory, file://, and every scheme registered in storage/checkpoint_store.h), verifying
// every stored byte against its checksum before the destination commits.
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_store.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {

const CommandSpec& CopySpec() {
  static const CommandSpec* spec = new CommandSpec{
      "copy",
      "usage: ckptctl copy <from> <to> [flags]",
      absl::StrCat(
          "Copies the committed checkpoint at <from> to <to>, each a directory or a URL of a\n"
          "registered checkpoint store (schemes: ",
          absl::StrJoin(RegisteredStoreSchemes(), ", "),
          "). Every stored byte is checked against\n"
          "the source manifest's XXH3-64 checksums as it streams, before the destination\n"
          "commits: a corrupt source is DataLoss naming the tensor and file, and nothing is\n"
          "committed. The destination commits atomically; an existing checkpoint there is\n"
          "replaced only with --overwrite, and stays readable until the copy commits.\n"),
      {{"overwrite", "", "replace a committed checkpoint at <to> (only a checkpoint)"},
       {"parallelism", "N", "data files copied at once (default 4)"},
       {"chunk-size", "SIZE", "bytes per read and write of one file (default 8MiB)"},
       {"timeout", "DURATION", "deadline of the whole copy (default 1h)"}}};
  return *spec;
}

int RunCopyCommand(const std::vector<std::string>& args) {
  const std::string cmd = "copy";
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(CopySpec(), args, &a)) return *code;
  if (a.positional.size() != 2) return Usage(cmd, "expected <from> <to>");
  CopyOptions options;
  options.overwrite = a.Has("overwrite");
  for (const absl::Status& s : {IntFlag(a, "parallelism", 1, 256, &options.parallelism),
                                SizeFlag(a, "chunk-size", 4096, &options.chunk_bytes),
                                DurationFlag(a, "timeout", &options.timeout)}) {
    if (!s.ok()) return Usage(cmd, std::string(s.message()));
  }
  absl::StatusOr<CopyReport> report = CopyCheckpoint(a.positional[0], a.positional[1], options);
  if (!report.ok()) return Fail(cmd, report.status());
  const double seconds = absl::ToDoubleSeconds(report->elapsed);
  std::printf("copied %s to %s: %" PRId64 " files, %s, %" PRId64
              " pieces verified, %.2f s (%.2f GB/s)\n",
              a.positional[0].c_str(), a.positional[1].c_str(), report->files,
              HumanBytes(report->bytes).c_str(), report->pieces_verified, seconds,
              seconds > 0 ? report->bytes / seconds / 1e9 : 0.0);
  return 0;
}

}  // namespace ckpt::ckptctl
