// Read-only access to the tensors of a checkpoint of any format ckpt reads natively, by ranges
// of each tensor's row-major elements, so tools (ckptctl diff) can walk two checkpoints in
// bounded memory without caring how either one is sharded or stored:
//   - a ckpt checkpoint (a directory with manifest.pb, or an object-store URL, s3://, read in
//     place with ranged GETs): any layout; ranges are assembled from
//     the overlapping pieces with checksums verified (CheckpointReader::ReadRegion);
//   - safetensors: a .safetensors file, a directory of them, or a model.safetensors.index.json
//     (the sources `ckptctl import` accepts); ranges are byte ranges of the files.
#ifndef CKPT_STORAGE_TENSOR_SOURCE_H_
#define CKPT_STORAGE_TENSOR_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/io_engine.h"
#include "storage/tensor_compare.h"

namespace ckpt {

// A checkpoint's tensors, readable by element ranges.
class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // What was opened, e.g. "ckpt checkpoint /c/step5" or "safetensors (3 files) /m".
  virtual std::string Describe() const = 0;
  // Every tensor, sorted by key.
  virtual const std::vector<TensorDescription>& tensors() const = 0;
  // Copies elements [start, stop) of tensor `key`'s row-major flattening to `dest`
  // ((stop - start) * element size bytes). Errors name the tensor and the file.
  virtual absl::Status ReadElements(const std::string& key, int64_t start, int64_t stop,
                                    char* dest) const = 0;
};

// True if `path` is a directory holding manifest.pb or a ".metadata" (the formats a checkpoint
// directory may have); for choosing how to open it.
bool IsCkptCheckpointDir(const std::string& path);
bool IsDcpCheckpointDir(const std::string& path);

// Opens `path` as a ckpt checkpoint (directory with manifest.pb, or at an object-store URL) or
// as safetensors (file, directory of *.safetensors, index .json). A directory that is neither is
// InvalidArgument saying what was looked for; a DCP directory (".metadata") is Unimplemented here
// (DCP is read by python/ckpt/interop/dcp.py).
absl::StatusOr<std::unique_ptr<TensorSource>> OpenTensorSource(const std::string& path,
                                                               const IoOptions& io);

}  // namespace ckpt

#endif  // CKPT_STORAGE_TENSOR_SOURCE_H_
