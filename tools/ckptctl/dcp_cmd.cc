// ckptctl import --from dcp / export --to dcp: PyTorch DCP and Megatron torch_dist checkpoints,
// converted by python/ckpt/interop/dcp.py (found as tools/ckptctl/dcp_bridge.h says). This file
// only checks the arguments and passes them on.
#include "tools/ckptctl/dcp_cmd.h"

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/tensor_source.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/dcp_bridge.h"
#include "tools/ckptctl/store_staging.h"

namespace ckpt::ckptctl {

const char kDcpImportHelp[] =
    "PyTorch DCP sources: ckptctl import --from dcp <dcp-dir> <checkpoint> [--overwrite]\n"
    "[--workers N] [--memory-budget SIZE] [--step N]\n"
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

const char kDcpExportHelp[] =
    "PyTorch DCP destinations: ckptctl export --to dcp <checkpoint> <dcp-dir>\n"
    "[--layout layout.json] [--workers N] [--memory-budget SIZE] [--max-file-size SIZE]\n"
    "Writes a PyTorch DCP checkpoint that torch.distributed.checkpoint.load reads into any\n"
    "sharding (plain tensors, DTensors). Its chunks are the main-replica pieces of --layout\n"
    "(docs/layout.md; flat ranges become boxes), else the stored pieces; rank r's chunks go\n"
    "to __<r>_<i>.distcp (at most --max-file-size of chunks each, default 4GiB), written with\n"
    "torch.save, and .metadata is torch's own Metadata, pickled. Entries imported from DCP as\n"
    "bytes are written back verbatim; a checkpoint imported from torch_dist gets its\n"
    "metadata.json and common.pt back. <dcp-dir> must not exist; it is built under a hidden\n"
    "sibling name and renamed into place when complete.\n";

const std::vector<FlagSpec>& DcpImportFlagSpecs() {
  static const std::vector<FlagSpec>* flags = new std::vector<FlagSpec>{
      {"from", "dcp", "the source is a PyTorch DCP / torch_dist directory"},
      {"workers", "N", "DCP: converter processes (default min(8, CPUs))"},
      {"memory-budget", "SIZE",
       "DCP: item data held at once, shared by the workers (default 1GiB)"},
      {"step", "N", "DCP: the checkpoint's step (default: torch_dist's iteration)"},
  };
  return *flags;
}

const std::vector<FlagSpec>& DcpExportFlagSpecs() {
  static const std::vector<FlagSpec>* flags = new std::vector<FlagSpec>{
      {"to", "dcp", "write a PyTorch DCP directory"},
      {"layout", "FILE", "DCP: chunks are this layout's main-replica pieces (docs/layout.md)"},
      {"workers", "N", "DCP: converter processes (default min(8, CPUs))"},
      {"memory-budget", "SIZE",
       "DCP: item data held at once, shared by the workers (default 1GiB)"},
  };
  return *flags;
}

namespace {

// Passes the checked arguments on; the converter prints its own messages.
int Run(const std::string& cmd, std::vector<std::string> converter_args) {
  absl::StatusOr<int> code = RunDcpConverter(converter_args);
  if (!code.ok()) return Fail(cmd, code.status());
  return *code;
}

// Appends "--name value" for each value flag present.
void PassOn(const ParsedArgs& a, const std::vector<std::string>& names,
            std::vector<std::string>* out) {
  for (const std::string& n : names) {
    if (a.flags.count(n)) {
      out->push_back("--" + n);
      out->push_back(a.flags.at(n));
    }
  }
}

// Sizes and counts are checked here, so usage errors read like ckptctl's own.
absl::Status CheckValues(const ParsedArgs& a) {
  int64_t v = 0;
  CKPT_RETURN_IF_ERROR(SizeFlag(a, "memory-budget", 1, &v));
  CKPT_RETURN_IF_ERROR(SizeFlag(a, "max-file-size", 1, &v));
  CKPT_RETURN_IF_ERROR(IntFlag(a, "workers", 1, 4096, &v));
  return IntFlag(a, "step", std::numeric_limits<int64_t>::min(),
                 std::numeric_limits<int64_t>::max(), &v);
}

}  // namespace

bool WantsDcp(const ParsedArgs& args, const std::string& flag, bool detect_source) {
  if (args.Get(flag) == "dcp") return true;
  return detect_source && !args.Has(flag) && !args.positional.empty() &&
         IsDcpCheckpointDir(args.positional[0]);
}

int RunDcpImport(const ParsedArgs& a) {
  const std::string cmd = "import";
  if (a.Has("from") && a.Get("from") != "dcp") {
    return Usage(cmd, "--from must be dcp (safetensors sources need no --from)");
  }
  if (absl::Status s = RefuseFlags(a, {"threads", "direct-io", "no-uring"},
                                   "applies only to safetensors sources");
      !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <dcp-dir> <checkpoint>");
  if (absl::Status s = RequireLocal(a.positional[0], "source"); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (absl::Status s = CheckValues(a); !s.ok()) return Usage(cmd, std::string(s.message()));
  auto dest = WritableCheckpoint::Create(a.positional[1], a.Has("overwrite"));  // s3:// too
  if (!dest.ok()) return Fail(cmd, dest.status());
  std::vector<std::string> out = {"import", a.positional[0], (*dest)->path()};
  if (a.Has("overwrite")) out.push_back("--overwrite");
  PassOn(a, {"workers", "memory-budget", "step"}, &out);
  const int code = Run(cmd, out);
  if (code != 0) return code;
  if (absl::Status s = (*dest)->Publish(); !s.ok()) return Fail(cmd, s);
  return 0;
}

int RunDcpExport(const ParsedArgs& a) {
  const std::string cmd = "export";
  if (a.Has("to") && a.Get("to") != "dcp") return Usage(cmd, "--to must be dcp");
  if (absl::Status s =
          RefuseFlags(a, {"overwrite", "dtype", "rename", "threads", "direct-io", "no-uring"},
                      "applies only to safetensors exports");
      !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <checkpoint> <dcp-dir>");
  if (absl::Status s = RequireLocal(a.positional[1], "output"); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (absl::Status s = CheckValues(a); !s.ok()) return Usage(cmd, std::string(s.message()));
  // The converter opens data files by path: an s3:// checkpoint is first copied locally.
  auto source = ReadableCheckpoint::Open(a.positional[0]);
  if (!source.ok()) return Fail(cmd, source.status());
  std::vector<std::string> out = {"export", (*source)->path(), a.positional[1]};
  PassOn(a, {"layout", "workers", "memory-budget", "max-file-size"}, &out);
  return Run(cmd, out);
}

}  // namespace ckpt::ckptctl
