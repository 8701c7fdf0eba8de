// Writing and checking checkpoints of the example GPT state (examples/gpt_state.h) in a given
// layout, for end-to-end tests, benchmarks and the demo.
#ifndef CKPT_EXAMPLES_GPT_CHECKPOINT_H_
#define CKPT_EXAMPLES_GPT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/layout_spec.h"
#include "reshard/wave_writer.h"
#include "sharding/tensor_meta.h"
#include "storage/checkpoint_writer.h"

namespace ckpt {

// Writes the state's tensors as laid out by `layout` (each distinct main-replica piece once,
// writers and files from the planner's save plan, content from FillPiece) as a committed
// checkpoint, holding at most about `wave_bytes` of piece data at once.
absl::StatusOr<WaveWriteStats> WriteGptCheckpoint(
    const std::string& path, const std::vector<TensorMeta>& tensors, const LayoutSpec& layout,
    int64_t wave_bytes, const WriteOptions& options, int64_t step = 0,
    const std::map<std::string, std::string>& user_metadata = {});

// What CheckGptCheckpoint looked at.
struct GptCheckReport {
  int64_t regions = 0;   // distinct (key, region) read back
  int64_t elements = 0;  // elements compared
  int64_t bytes = 0;
};

// Reads back every distinct non-empty piece that `layout` gives any rank (through the storage
// reader, checksums verified) and compares each element with VerifyPiece. The first mismatch
// or read error is returned.
absl::StatusOr<GptCheckReport> CheckGptCheckpoint(const std::string& path,
                                                  const std::vector<TensorMeta>& tensors,
                                                  const LayoutSpec& layout);

}  // namespace ckpt

#endif  // CKPT_EXAMPLES_GPT_CHECKPOINT_H_
