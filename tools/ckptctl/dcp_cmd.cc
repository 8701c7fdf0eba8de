// ckptctl import --from dcp / export --to dcp: PyTorch DCP and Megatron torch_dist checkpoints,
// converted by python/ckpt/interop/dcp.py (found as tools/ckptctl/dcp_bridge.h says). This file
// only checks the arguments and passes them on.
#include "tools/ckptctl/dcp_cmd.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/tensor_source.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/dcp_bridge.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kImportUsage[] =
    "usage: ckptctl import --from dcp <dcp-dir> <checkpoint> [--overwrite] [--workers N]\n"
    "                      [--memory-budget SIZE] [--step N]\n\n"
    "Converts a PyTorch DCP checkpoint (FileSystemWriter: .metadata + __<rank>_<i>.distcp),\n"
    "or a Megatron-core torch_dist one (the same plus metadata.json and common.pt), into a\n"
    "ckpt checkpoint. A directory holding .metadata is taken as DCP without --from.\n"
    "Every DCP chunk becomes one piece (nothing is gathered); non-tensor entries are kept\n"
    "verbatim as U8 tensors named in the user metadata \"dcp.bytes_entries\"; torch_dist's\n"
    "metadata.json is kept as user metadata and common.pt verbatim (its iteration becomes the\n"
    "step unless --step is given). The metadata pickle is read by an unpickler that admits\n"
    "only DCP's metadata classes, items with torch.load(weights_only=True): no code from the\n"
    "checkpoint runs. A refused or broken input (missing .distcp, truncated item, foreign\n"
    "class) is one message naming the file; nothing is written at the destination.\n"
    "--workers processes (default min(8, CPUs)) share --memory-budget (default 1GiB) of item\n"
    "data. Runs python/ckpt/interop/dcp.py with the project's Python environment\n"
    "($CKPT_PYTHON and $CKPT_INTEROP_PATH override where they are found).\n";

constexpr char kExportUsage[] =
    "usage: ckptctl export --to dcp <checkpoint> <dcp-dir> [--layout layout.json]\n"
    "                      [--workers N] [--memory-budget SIZE] [--max-file-size SIZE]\n\n"
    "Writes a PyTorch DCP checkpoint that torch.distributed.checkpoint.load reads into any\n"
    "sharding (plain tensors, DTensors). Its chunks are the main-replica pieces of --layout\n"
    "(docs/layout.md; flat ranges become boxes), else the stored pieces; rank r's chunks go\n"
    "to __<r>_<i>.distcp (at most --max-file-size of chunks each, default 4GiB), written with\n"
    "torch.save, and .metadata is torch's own Metadata, pickled. Entries imported from DCP as\n"
    "bytes are written back verbatim; a checkpoint imported from torch_dist gets its\n"
    "metadata.json and common.pt back. <dcp-dir> must not exist; it is built under a hidden\n"
    "sibling name and renamed into place when complete.\n";

// Passes the checked arguments on; the converter prints its own messages.
int Run(const std::string& cmd, std::vector<std::string> converter_args) {
  absl::StatusOr<int> code = RunDcpConverter(converter_args);
  if (!code.ok()) return Fail(cmd, code.status());
  return *code;
}

// Appends "--name value" for each value flag present.
void PassOn(const Args& a, const std::vector<std::string>& names, std::vector<std::string>* out) {
  for (const std::string& n : names) {
    if (a.flags.count(n)) {
      out->push_back("--" + n);
      out->push_back(a.flags.at(n));
    }
  }
}

// Sizes and counts are checked here, so usage errors read like ckptctl's own.
std::string CheckValues(const Args& a) {
  for (const char* n : {"memory-budget", "max-file-size"}) {
    int64_t bytes;
    if (a.flags.count(n) && !ParseSize(a.flags.at(n), &bytes)) {
      return absl::StrCat("bad --", n, " \"", a.flags.at(n), "\"");
    }
  }
  int64_t v;
  if (a.flags.count("workers") && (!absl::SimpleAtoi(a.flags.at("workers"), &v) || v < 1)) {
    return "--workers must be a positive integer";
  }
  if (a.flags.count("step") && !absl::SimpleAtoi(a.flags.at("step"), &v)) {
    return "--step must be an integer";
  }
  return "";
}

}  // namespace

bool WantsDcp(const std::vector<std::string>& args, const char* flag, bool detect_source) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == absl::StrCat("--", flag, "=dcp")) return true;
    if (args[i] == absl::StrCat("--", flag) && i + 1 < args.size() && args[i + 1] == "dcp") {
      return true;
    }
  }
  if (!detect_source) return false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) == 0) continue;
    return IsDcpCheckpointDir(args[i]);  // the first positional: the source
  }
  return false;
}

int RunDcpImport(const std::vector<std::string>& args) {
  const std::string cmd = "import";
  Args a = ParseArgs(args, {"overwrite", "help"}, {"from", "workers", "memory-budget", "step"});
  if (a.flags.count("help")) {
    std::fputs(kImportUsage, stdout);
    return 0;
  }
  if (!a.error.empty()) return Usage(cmd, a.error);
  if (a.flags.count("from") && a.flags.at("from") != "dcp") {
    return Usage(cmd, "--from must be dcp (safetensors sources need no --from)");
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <dcp-dir> <checkpoint>");
  if (std::string e = CheckValues(a); !e.empty()) return Usage(cmd, e);
  std::vector<std::string> out = {"import", a.positional[0], a.positional[1]};
  if (a.flags.count("overwrite")) out.push_back("--overwrite");
  PassOn(a, {"workers", "memory-budget", "step"}, &out);
  return Run(cmd, out);
}

int RunDcpExport(const std::vector<std::string>& args) {
  const std::string cmd = "export";
  Args a = ParseArgs(args, {"help"}, {"to", "layout", "workers", "memory-budget", "max-file-size"});
  if (a.flags.count("help")) {
    std::fputs(kExportUsage, stdout);
    return 0;
  }
  if (!a.error.empty()) return Usage(cmd, a.error);
  if (a.flags.count("to") && a.flags.at("to") != "dcp") {
    return Usage(cmd, "--to must be dcp here");
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <checkpoint> <dcp-dir>");
  if (std::string e = CheckValues(a); !e.empty()) return Usage(cmd, e);
  std::vector<std::string> out = {"export", a.positional[0], a.positional[1]};
  PassOn(a, {"layout", "workers", "memory-budget", "max-file-size"}, &out);
  return Run(cmd, out);
}

}  // namespace ckpt::ckptctl
