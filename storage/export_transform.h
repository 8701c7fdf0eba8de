// What an export may change on the way out (ckptctl export --dtype, --rename): element type
// conversion of floating-point tensors (e.g. fp32 master weights to bf16, rounding to nearest
// even exactly as torch's Tensor.to does) and key renaming through a mapping file. Pure: no
// I/O besides parsing text the caller read.
#ifndef CKPT_STORAGE_EXPORT_TRANSFORM_H_
#define CKPT_STORAGE_EXPORT_TRANSFORM_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/dtype.h"

namespace ckpt {

// The floating dtypes an export converts between: F64, F32, F16, BF16.
bool IsConvertibleFloat(DType dtype);

// The dtype a tensor of `dtype` is exported as when floating tensors go to `target`: target
// for F64/F32/F16/BF16 tensors, `dtype` itself for all others (integers, bools, F8, C64).
DType ExportedDType(DType dtype, std::optional<DType> target);

// Converts `count` elements from `from` to `to` (both IsConvertibleFloat) with round to
// nearest even; NaN stays NaN (quiet, sign kept, as torch: F32 NaN -> BF16 0x7fc0 | sign),
// overflow becomes infinity, and subnormals are kept where the target has them. F64 -> F16 /
// BF16 rounds once, from the exact value.
void ConvertFloats(DType from, DType to, const char* in, char* out, int64_t count);

// A key mapping: JSON object {"old key": "new key", ...}. Errors (InvalidArgument naming
// `source`): not an object, a non-string value, an empty new key, two old keys mapped to one
// new key.
absl::StatusOr<std::map<std::string, std::string>> ParseKeyMapping(absl::string_view json,
                                                                   absl::string_view source);

// The exported names of `keys` under `mapping` (keys it does not name keep theirs). Errors
// name the problem: a mapped key not in `keys` (a typo would otherwise pass silently), or two
// tensors ending up with one name.
absl::StatusOr<std::vector<std::string>> RenameKeys(
    const std::vector<std::string>& keys, const std::map<std::string, std::string>& mapping);

}  // namespace ckpt

#endif  // CKPT_STORAGE_EXPORT_TRANSFORM_H_
