// The input and output files of `ckptctl plan`: the whole input in memory (a regular file
// mapped, not copied), the output written in one piece and replaced atomically.
#ifndef CKPT_TOOLS_CKPTCTL_PLAN_IO_H_
#define CKPT_TOOLS_CKPTCTL_PLAN_IO_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::ckptctl {

// The whole input. A non-empty regular file is mapped read-only (its pages come from the
// page cache: no copy, no fresh memory to fault in); a pipe, stdin or an empty file is read
// into one buffer that is never zero-filled first.
class PlanInput {
 public:
  PlanInput() = default;
  PlanInput(PlanInput&& other) noexcept;
  PlanInput& operator=(PlanInput&& other) = delete;
  PlanInput(const PlanInput&) = delete;
  ~PlanInput();

  absl::string_view view() const { return absl::string_view(data_, size_); }

 private:
  friend absl::StatusOr<PlanInput> ReadPlanInput(const std::optional<std::string>& path);

  // Appends up to `n` bytes from `fd` (one read(2)) to the buffer; its result.
  ssize_t ReadFrom(int fd, size_t n);

  const char* data_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // with data_ == mapping_ when the file is mapped
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
};

// The --input file (not a directory), else stdin. A mapped file that is truncated while the
// command runs ends it with a message and exit status 1 (SIGBUS is caught for this), before
// any output is written.
absl::StatusOr<PlanInput> ReadPlanInput(const std::optional<std::string>& path);

// Prepares this process's heap for a run over `input_bytes` of input: the large arrays of
// parsing, planning and output (about 2x the input) come from one region of the heap that
// is advised to use transparent huge pages (one fault per 2 MiB instead of 512), and freed
// arrays are reused rather than returned. Only a hint: where the kernel gives no huge pages
// the run is the same, a little slower.
void UseHugePagesForLargeArrays(size_t input_bytes);

// `text` to the --output file (written to FILE.tmp, then renamed over FILE), else stdout.
absl::Status WritePlanOutput(const std::optional<std::string>& path, absl::string_view text);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_PLAN_IO_H_
