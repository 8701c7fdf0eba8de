// ckptctl: the operator's command-line tool. See `ckptctl --help`.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {

// Entry points, one per module (tools/ckptctl/*_cmd.cc). Add new ones here and below.
int RunPlanCommand(const std::vector<std::string>& args);     // plan_cmd.cc
int RunInspectCommand(const std::vector<std::string>& args);  // storage_cmd.cc
int RunVerifyCommand(const std::vector<std::string>& args);   // storage_cmd.cc
int RunImportCommand(const std::vector<std::string>& args);   // storage_cmd.cc
int RunExportCommand(const std::vector<std::string>& args);   // storage_cmd.cc
int RunStatusCommand(const std::vector<std::string>& args);   // status_cmd.cc
int RunSaveCommand(const std::vector<std::string>& args);     // operation_cmd.cc
int RunLoadCommand(const std::vector<std::string>& args);     // operation_cmd.cc
int RunReshardCommand(const std::vector<std::string>& args);  // reshard_cmd.cc
int RunCertsCommand(const std::vector<std::string>& args);    // certs_cmd.cc
int RunGcCommand(const std::vector<std::string>& args);       // gc_cmd.cc
int RunDiffCommand(const std::vector<std::string>& args);     // diff_cmd.cc

const std::vector<Command>& AllCommands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"plan", "Megatron-exact distributions, DTensor shards on JSON Lines (see plan --help)",
       RunPlanCommand},
      {"inspect", "show a checkpoint's tensors, pieces, files, layout and metadata",
       RunInspectCommand},
      {"verify", "check manifest/file agreement, every checksum and exact coverage",
       RunVerifyCommand},
      {"import", "convert Hugging Face safetensors (file, dir or index.json) into a checkpoint",
       RunImportCommand},
      {"export", "consolidate a checkpoint into full tensors as safetensors", RunExportCommand},
      {"diff", "compare two checkpoints (any formats, layouts) tensor by tensor; exit 0 same",
       RunDiffCommand},
      {"status", "workers, jobs and operations in flight (with progress) of a coordinator",
       RunStatusCommand},
      {"save", "operator-requested save of a running job (at its next Poll); waits for commit",
       RunSaveCommand},
      {"load", "operator-requested load of a running job into its current layout", RunLoadCommand},
      {"reshard", "rewrite a checkpoint into a target layout's pieces (in-process or on a cluster)",
       RunReshardCommand},
      {"certs", "make the CA and the coordinator/worker/operator certificates (TLS)",
       RunCertsCommand},
      {"gc", "remove the staging directories interrupted writes left (listed with sizes)",
       RunGcCommand},
  };
  return *commands;
}

namespace {

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: ckptctl <command> [args...]\n"
               "       ckptctl <command> --help\n\n"
               "Saves, loads, reshards, inspects and verifies ckpt checkpoints.\n\ncommands:\n");
  for (const Command& c : AllCommands()) std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
}

}  // namespace
}  // namespace ckpt::ckptctl

int main(int argc, char** argv) {
  using ckpt::ckptctl::AllCommands;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    ckpt::ckptctl::PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& c : AllCommands()) {
    if (args[0] == c.name) return c.run(args);
  }
  std::fprintf(stderr, "ckptctl: unknown command \"%s\" (see ckptctl --help)\n", argv[1]);
  return 2;
}
