// ckptctl: the operator's command-line tool. See `ckptctl --help`.
#include <cstdio>
#include <cstring>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& c : ckpt::ckptctl::AllCommands()) {
    if (args[0] == c.name) return c.run(args);
  }
  std::fprintf(stderr, "ckptctl: unknown command \"%s\" (see ckptctl --help)\n", argv[1]);
  return 2;
}
