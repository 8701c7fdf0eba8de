// ckptctl import --from dcp / export --to dcp (tools/ckptctl/dcp_cmd.cc).
#ifndef CKPT_TOOLS_CKPTCTL_DCP_CMD_H_
#define CKPT_TOOLS_CKPTCTL_DCP_CMD_H_

#include <string>
#include <vector>

#include "tools/ckptctl/cli_args.h"

namespace ckpt::ckptctl {

// True if the parsed arguments ask for DCP: "--<flag> dcp", or with `detect_source` a first
// positional argument that is a DCP directory (holds .metadata).
bool WantsDcp(const ParsedArgs& args, const std::string& flag, bool detect_source);

// The DCP forms of `ckptctl import` and `ckptctl export`, on their parsed command lines
// (tools/ckptctl/storage_cmd.cc holds the flag tables, DCP flags included).
int RunDcpImport(const ParsedArgs& args);
int RunDcpExport(const ParsedArgs& args);

// The flags only the DCP forms take, and the --help paragraphs about them.
const std::vector<FlagSpec>& DcpImportFlagSpecs();  // from, workers, memory-budget, step
const std::vector<FlagSpec>& DcpExportFlagSpecs();  // to, layout, workers, memory-budget
extern const char kDcpImportHelp[];
extern const char kDcpExportHelp[];

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DCP_CMD_H_
