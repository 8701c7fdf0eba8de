// Helpers shared by the safetensors encoder (safetensors.cc) and header parser
// (safetensors_parse.cc). Not part of the storage API.
#ifndef CKPT_STORAGE_SAFETENSORS_INTERNAL_H_
#define CKPT_STORAGE_SAFETENSORS_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/dtype.h"
#include "storage/safetensors.h"

namespace ckpt::safetensors_internal {

// DataLoss "safetensors file <file>[, entry "<entry>"]: <what>".
absl::Status Bad(absl::string_view file, absl::string_view entry, absl::string_view what);

// Length in bytes of the UTF-8 sequence starting at s[i], or 0 if it is not well formed.
size_t Utf8SequenceLength(absl::string_view s, size_t i);

// Entry byte size for dtype and shape, or an error on overflow / invalid shape.
absl::StatusOr<int64_t> EntryBytes(DType dtype, const std::vector<int64_t>& shape);

// Checks entries sorted by offset are contiguous from 0; returns the end of the last one.
absl::StatusOr<int64_t> CheckContiguous(const std::vector<SafetensorsEntry>& sorted,
                                        absl::string_view file);

}  // namespace ckpt::safetensors_internal

#endif  // CKPT_STORAGE_SAFETENSORS_INTERNAL_H_
