// ckptctl subcommands. Each takes the arguments after the subcommand name (args[0] is the
// subcommand itself), writes results to stdout and one-line errors to stderr, and returns the
// process exit code (0 ok, 1 failure, 2 usage error). Each declares its flags in one table
// (tools/ckptctl/cli_args.h), which its --help lists.
#ifndef CKPT_TOOLS_CKPTCTL_COMMANDS_H_
#define CKPT_TOOLS_CKPTCTL_COMMANDS_H_

#include <string>
#include <vector>

#include "tools/ckptctl/cli_args.h"

namespace ckpt::ckptctl {

// A subcommand: name, one-line summary for `ckptctl --help`, its entry point and its flag
// table.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
  const CommandSpec& (*spec)();
};

// Every subcommand, in the order `ckptctl --help` lists them (tools/ckptctl/commands.cc).
const std::vector<Command>& AllCommands();

// Entry points and flag tables, one pair per subcommand (tools/ckptctl/*_cmd.cc).
int RunPlanCommand(const std::vector<std::string>& args);  // plan_cmd.cc
const CommandSpec& PlanSpec();
int RunInspectCommand(const std::vector<std::string>& args);  // storage_cmd.cc
const CommandSpec& InspectSpec();
int RunVerifyCommand(const std::vector<std::string>& args);  // storage_cmd.cc
const CommandSpec& VerifySpec();
int RunImportCommand(const std::vector<std::string>& args);  // storage_cmd.cc
const CommandSpec& ImportSpec();
int RunExportCommand(const std::vector<std::string>& args);  // storage_cmd.cc
const CommandSpec& ExportSpec();
int RunDiffCommand(const std::vector<std::string>& args);  // diff_cmd.cc
const CommandSpec& DiffSpec();
int RunStatusCommand(const std::vector<std::string>& args);  // status_cmd.cc
const CommandSpec& StatusSpec();
int RunSaveCommand(const std::vector<std::string>& args);  // operation_cmd.cc
const CommandSpec& SaveSpec();
int RunLoadCommand(const std::vector<std::string>& args);  // operation_cmd.cc
const CommandSpec& LoadSpec();
int RunReshardCommand(const std::vector<std::string>& args);  // reshard_cmd.cc
const CommandSpec& ReshardSpec();
int RunCertsCommand(const std::vector<std::string>& args);  // certs_cmd.cc
const CommandSpec& CertsSpec();
int RunGcCommand(const std::vector<std::string>& args);  // gc_cmd.cc
const CommandSpec& GcSpec();
int RunTransferCommand(const std::vector<std::string>& args);  // transfer_cmd.cc
const CommandSpec& TransferSpec();
int RunCopyCommand(const std::vector<std::string>& args);  // copy_cmd.cc
const CommandSpec& CopySpec();

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_COMMANDS_H_
