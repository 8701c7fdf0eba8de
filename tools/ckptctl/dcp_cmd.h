// ckptctl import --from dcp / export --to dcp (tools/ckptctl/dcp_cmd.cc).
#ifndef CKPT_TOOLS_CKPTCTL_DCP_CMD_H_
#define CKPT_TOOLS_CKPTCTL_DCP_CMD_H_

#include <string>
#include <vector>

namespace ckpt::ckptctl {

// True if the arguments ask for DCP: "--<flag> dcp" / "--<flag>=dcp", or with
// `detect_source` a first positional argument that is a DCP directory (holds .metadata).
bool WantsDcp(const std::vector<std::string>& args, const char* flag, bool detect_source);

// The DCP forms of `ckptctl import` and `ckptctl export` (args[0] is the subcommand).
int RunDcpImport(const std::vector<std::string>& args);
int RunDcpExport(const std::vector<std::string>& args);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DCP_CMD_H_
