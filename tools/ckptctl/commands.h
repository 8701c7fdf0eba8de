// ckptctl subcommands. Each takes the arguments after the subcommand name (args[0] is the
// subcommand itself), writes results to stdout and one-line errors to stderr, and returns the
// process exit code (0 ok, 1 failure, 2 usage error).
#ifndef CKPT_TOOLS_CKPTCTL_COMMANDS_H_
#define CKPT_TOOLS_CKPTCTL_COMMANDS_H_

#include <string>
#include <vector>

namespace ckpt::ckptctl {

// A subcommand: name, one-line summary for `ckptctl --help`, and its entry point.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

// Every subcommand, in the order `ckptctl --help` lists them (defined in main.cc).
const std::vector<Command>& AllCommands();

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_COMMANDS_H_
