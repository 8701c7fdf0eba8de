// ckptctl: the operator's command-line tool. See `ckptctl --help`.
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tools/ckptctl/commands.h"

namespace {

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: ckptctl <command> [args...]\n"
               "       ckptctl <command> --help   (every flag of the command)\n\n"
               "Saves, loads, reshards, inspects and verifies ckpt checkpoints. Flags are\n"
               "spelled --kebab-case, as --flag VALUE or --flag=VALUE.\n\ncommands:\n");
  for (const auto& c : ckpt::ckptctl::AllCommands()) {
    std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
  }
}

// Commands that read or write storage checkpoints only. A mem://<name> argument names a
// memory checkpoint (held in the workers' memory, known to the coordinator): refused before
// anything runs, naming it (exit 2), instead of failing later as a missing directory. (A
// cluster reshard's mem:// source or destination is refused by the coordinator as well.)
bool RefusesMemoryPath(const std::vector<std::string>& args) {
  static const std::set<std::string> kStorageOnly = {"inspect", "verify", "import", "export",
                                                     "diff",    "gc",     "reshard"};
  if (kStorageOnly.count(args[0]) == 0) return false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].rfind("mem://", 0) != 0) continue;
    std::fprintf(stderr,
                 "ckptctl %s: invalid argument: '%s' is a memory checkpoint (in the workers' "
                 "memory); %s works on storage checkpoints: load it into a job, or persist it "
                 "to storage first (save --persist-to)\n",
                 args[0].c_str(), args[i].c_str(), args[0].c_str());
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (RefusesMemoryPath(args)) return 2;
  for (const auto& c : ckpt::ckptctl::AllCommands()) {
    if (args[0] == c.name) return c.run(args);
  }
  std::fprintf(stderr, "ckptctl: unknown command \"%s\" (see ckptctl --help)\n", argv[1]);
  return 2;
}
