// Conversion between ckpt checkpoints and Hugging Face-style safetensors checkpoints
// (ckptctl import / export).
#ifndef CKPT_STORAGE_INTEROP_H_
#define CKPT_STORAGE_INTEROP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "storage/checkpoint_writer.h"
#include "storage/stage_pipeline.h"

namespace ckpt {

// The safetensors files named by an import source: a .safetensors file, a directory (every
// *.safetensors in it, sorted), or a model.safetensors.index.json (the files its weight_map
// names, which must be plain names in the index's directory and hold exactly the mapped keys).
absl::StatusOr<std::vector<std::string>> ResolveImportSource(const std::string& source);

// Imports the source as a checkpoint at `ckpt` (each tensor whole, one data file per source
// file, or several of at most 65,536 tensors each for a bigger one), with the commit
// protocol. Keys appearing in two files are an error. Uses ImportOptions' default budget.
absl::StatusOr<pb::Manifest> ImportSafetensors(const std::string& source, const std::string& ckpt,
                                               const WriteOptions& options);

// How an import reads and writes.
struct ImportOptions {
  WriteOptions write;
  // Source bytes held at once: two chunks of at most half this each (4 KiB at least), one
  // being read while the other is hashed and written, both reused across chunks and files.
  int64_t memory_budget_bytes = int64_t{128} << 20;
  // Read chunk k + 1 while chunk k is written (false: read, then write, in turn).
  bool overlap = true;
  PipelineStats* stats = nullptr;  // filled in when not null
};

// The same, streaming each source file through options.memory_budget_bytes of buffers, reads
// overlapped with writes; the checkpoint is the same whatever the budget.
absl::StatusOr<pb::Manifest> ImportSafetensors(const std::string& source, const std::string& ckpt,
                                               const ImportOptions& options);

struct ExportOptions {
  // Split into files of at most this many bytes of tensor data (a larger tensor gets a file of
  // its own); 0 means one file.
  int64_t max_file_bytes = 0;
  // Replace the files of an earlier export (regular files only, never links or
  // directories). In a directory that means the export-named files: model.safetensors,
  // model-<i>-of-<n>.safetensors and model.safetensors.index.json; the ones this export does
  // not rewrite are removed after it succeeds. Nothing else is ever touched.
  bool overwrite = false;
  IoOptions io;  // for reading the checkpoint
  // Floating-point tensors (F64, F32, F16, BF16) are written as this dtype (e.g. BF16 for
  // fp32 master weights; nearest even, as torch's Tensor.to), others keep theirs
  // (storage/export_transform.h). Memory then also holds a batch's source bytes.
  std::optional<DType> float_dtype;
  // Exported names: checkpoint key -> name (storage/export_transform.h RenameKeys: every
  // mapped key must exist, no two tensors may end up with one name). Others keep their key.
  std::map<std::string, std::string> rename;
  // Tensor bytes held at once: two batches of consecutive tensors (or of one larger tensor)
  // of at most half this each, one read while the other is written, both buffers reused
  // across batches and files. With float_dtype, a batch's source bytes come on top.
  int64_t memory_budget_bytes = int64_t{128} << 20;
  // Read batch k + 1 while batch k is written (false: read, then write, in turn).
  bool overlap = true;
  PipelineStats* stats = nullptr;  // filled in when not null
};

// Consolidates every tensor of `ckpt` into full, unsharded tensors. `out` ending in
// ".safetensors" is a single file (an error if the data must be split); otherwise `out` is a
// directory receiving model.safetensors, or model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json when split. Holds at most two batches of consecutive tensors
// (options.memory_budget_bytes; a larger tensor is a batch of its own), one being read while
// the other is written; each file is written under a fresh hidden temporary name, fsynced and
// renamed. Without overwrite, an existing output file (or any export-named file in the directory)
// is AlreadyExists. Returns the files written.
absl::StatusOr<std::vector<std::string>> ExportCheckpoint(const std::string& ckpt,
                                                          const std::string& out,
                                                          const ExportOptions& options);

}  // namespace ckpt

#endif  // CKPT_STORAGE_INTEROP_H_
