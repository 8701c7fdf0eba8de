// How ckptctl reaches the DCP / Megatron torch_dist converters, which are Python
// (python/ckpt/interop/dcp.py: torch itself writes and reads DCP's pickles and torch.save
// items) and run with the project's Python environment.
//
// The interpreter is $CKPT_PYTHON, else the environment Bazel built ckptctl against: the
// @python_venv//:pyvenv.cfg in ckptctl's runfiles, resolved to its real directory (.venv ->
// ~/.cache/ckpt-venvs/<hash>), + bin/python. The converter package is found on
// $CKPT_INTEROP_PATH, else <runfiles>/ckpt/python/ckpt (holding interop/dcp.py and the
// _storage extension). Runfiles are $RUNFILES_DIR, <ckptctl>.runfiles, or $TEST_SRCDIR.
#ifndef CKPT_TOOLS_CKPTCTL_DCP_BRIDGE_H_
#define CKPT_TOOLS_CKPTCTL_DCP_BRIDGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::ckptctl {

// Runs `python -m interop.dcp <args...>` with stdout and stderr passed through; returns its
// exit status (0 ok, 1 conversion refused or failed, 2 usage). Errors: the interpreter or the
// package cannot be found (FailedPrecondition saying what was looked for), or it could not
// be started.
absl::StatusOr<int> RunDcpConverter(const std::vector<std::string>& args);

// A DCP directory imported into a fresh ckpt checkpoint under $TMPDIR (default /tmp),
// removed with its directory when this is destroyed.
class TemporaryImport {
 public:
  TemporaryImport(std::string dir, std::string path)
      : dir_(std::move(dir)), path_(std::move(path)) {}
  ~TemporaryImport();
  TemporaryImport(const TemporaryImport&) = delete;
  TemporaryImport& operator=(const TemporaryImport&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

// Imports `dcp_dir` with at most `memory_budget` bytes of item data held; errors carry the
// converter's exit status (its message went to stderr).
absl::StatusOr<std::unique_ptr<TemporaryImport>> ImportDcpTemporarily(const std::string& dcp_dir,
                                                                      int64_t memory_budget);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_DCP_BRIDGE_H_
