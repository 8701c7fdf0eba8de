#include "sharding/dtype.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "BOOL";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI16:
      return "I16";
    case DType::kU16:
      return "U16";
    case DType::kI32:
      return "I32";
    case DType::kU32:
      return "U32";
    case DType::kI64:
      return "I64";
    case DType::kU64:
      return "U64";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kC64:
      return "C64";
  }
  return "?";
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return 1;
    case DType::kI16:
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI32:
    case DType::kU32:
    case DType::kF32:
      return 4;
    case DType::kI64:
    case DType::kU64:
    case DType::kF64:
    case DType::kC64:
      return 8;
  }
  return 0;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  std::vector<absl::string_view> names;
  for (DType d : kAllDTypes) names.push_back(DTypeName(d));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\"; valid dtypes: ", absl::StrJoin(names, " ")));
}

}  // namespace ckpt
