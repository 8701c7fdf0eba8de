// Element types of tensors, named exactly as safetensors names them.
#ifndef CKPT_SHARDING_DTYPE_H_
#define CKPT_SHARDING_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// A tensor element type. The enumerator order is not meaningful; names are.
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kC64,
};

// Every DType, in enumerator order.
inline constexpr DType kAllDTypes[] = {
    DType::kBool, DType::kU8,     DType::kI8,     DType::kI16,    DType::kU16,  DType::kI32,
    DType::kU32,  DType::kI64,    DType::kU64,    DType::kF16,    DType::kBF16, DType::kF32,
    DType::kF64,  DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0, DType::kC64};

// The safetensors name, e.g. "BF16", "F8_E4M3".
absl::string_view DTypeName(DType dtype);

// Size of one element in bytes.
int64_t DTypeSize(DType dtype);

// Parses a safetensors dtype name; unknown names are InvalidArgument listing the valid ones.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace ckpt

#endif  // CKPT_SHARDING_DTYPE_H_
