#include "storage/tensor_compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt {
namespace {

template <typename T>
T Load(const char* bytes) {
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

// A float of `mantissa_bits` / `exponent_bits` with IEEE-style subnormals; `has_inf` false
// for F8_E4M3 (e4m3fn: the all-ones exponent is finite except the all-ones NaN pattern).
double DecodeMinifloat(uint32_t bits, int exponent_bits, int mantissa_bits, bool has_inf) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint32_t sign = (bits >> (exponent_bits + mantissa_bits)) & 1;
  const uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const uint32_t max_exponent = (1u << exponent_bits) - 1;
  double value;
  if (exponent == max_exponent && has_inf) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == max_exponent && mantissa == (1u << mantissa_bits) - 1) {
    value = NAN;  // e4m3fn's only NaN
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    value = std::ldexp(static_cast<double>(mantissa | (1u << mantissa_bits)),
                       static_cast<int>(exponent) - bias - mantissa_bits);
  }
  return sign ? -value : value;
}

// The element as a double for the real floating dtypes, else nullopt.
std::optional<double> FloatValue(DType dtype, const char* bytes) {
  switch (dtype) {
    case DType::kF64:
      return Load<double>(bytes);
    case DType::kF32:
      return Load<float>(bytes);
    case DType::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(Load<uint16_t>(bytes)) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case DType::kF16:
      return DecodeMinifloat(Load<uint16_t>(bytes), 5, 10, true);
    case DType::kF8E4M3:
      return DecodeMinifloat(Load<uint8_t>(bytes), 4, 3, false);
    case DType::kF8E5M2:
      return DecodeMinifloat(Load<uint8_t>(bytes), 5, 2, true);
    case DType::kF8E8M0: {
      const uint8_t e = Load<uint8_t>(bytes);
      return e == 0xFF ? NAN : std::ldexp(1.0, static_cast<int>(e) - 127);
    }
    default:
      return std::nullopt;
  }
}

bool IsRealFloat(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return true;
    default:
      return false;
  }
}

std::string Bits(const char* bytes, int64_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, bytes, static_cast<size_t>(std::min<int64_t>(size, 8)));
  return absl::StrFormat("0x%0*x", static_cast<int>(2 * size), bits);
}

std::string FloatText(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

TensorListDiff DiffTensorLists(std::vector<TensorDescription> a, std::vector<TensorDescription> b) {
  auto by_key = [](const TensorDescription& x, const TensorDescription& y) {
    return x.key < y.key;
  };
  auto same_key = [](const TensorDescription& x, const TensorDescription& y) {
    return x.key == y.key;
  };
  for (auto* list : {&a, &b}) {
    std::stable_sort(list->begin(), list->end(), by_key);
    list->erase(std::unique(list->begin(), list->end(), same_key), list->end());
  }
  TensorListDiff diff;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].key < b[j].key)) {
      diff.only_in_a.push_back(a[i++].key);
    } else if (i == a.size() || b[j].key < a[i].key) {
      diff.only_in_b.push_back(b[j++].key);
    } else {
      if (a[i].dtype == b[j].dtype && a[i].shape == b[j].shape) {
        diff.comparable.push_back(a[i]);
      } else {
        diff.mismatched.emplace_back(a[i], b[j]);
      }
      ++i;
      ++j;
    }
  }
  return diff;
}

std::vector<std::pair<int64_t, int64_t>> ElementChunks(int64_t num_elements, int64_t max_elements) {
  max_elements = std::max<int64_t>(1, max_elements);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t start = 0; start < num_elements;) {
    const int64_t stop = start + std::min(max_elements, num_elements - start);
    chunks.emplace_back(start, stop);
    start = stop;
  }
  return chunks;
}

std::vector<int64_t> UnravelIndex(absl::Span<const int64_t> shape, int64_t index) {
  std::vector<int64_t> coordinates(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) break;
    coordinates[d] = index % shape[d];
    index /= shape[d];
  }
  return coordinates;
}

std::string FormatElement(DType dtype, const char* bytes) {
  const int64_t size = DTypeSize(dtype);
  switch (dtype) {
    case DType::kBool:
      return Load<uint8_t>(bytes) == 0 ? "false"
                                       : (Load<uint8_t>(bytes) == 1 ? "true" : Bits(bytes, 1));
    case DType::kU8:
      return absl::StrCat(Load<uint8_t>(bytes));
    case DType::kI8:
      return absl::StrCat(Load<int8_t>(bytes));
    case DType::kI16:
      return absl::StrCat(Load<int16_t>(bytes));
    case DType::kU16:
      return absl::StrCat(Load<uint16_t>(bytes));
    case DType::kI32:
      return absl::StrCat(Load<int32_t>(bytes));
    case DType::kU32:
      return absl::StrCat(Load<uint32_t>(bytes));
    case DType::kI64:
      return absl::StrCat(Load<int64_t>(bytes));
    case DType::kU64:
      return absl::StrCat(Load<uint64_t>(bytes));
    case DType::kC64:
      return absl::StrCat("(", FloatText(Load<float>(bytes)), ", ",
                          FloatText(Load<float>(bytes + 4)), ") (", Bits(bytes, 8), ")");
    default:
      break;
  }
  const std::optional<double> v = FloatValue(dtype, bytes);
  return absl::StrCat(v ? FloatText(*v) : "?", " (", Bits(bytes, size), ")");
}

void TensorComparison::AddChunk(int64_t start, absl::Span<const char> a, absl::Span<const char> b) {
  const int64_t size = DTypeSize(dtype_);
  const int64_t n = static_cast<int64_t>(std::min(a.size(), b.size())) / size;
  const bool is_float = IsRealFloat(dtype_);
  int64_t i = 0;
  while (i < n) {
    // Skip the equal prefix with memcmp, then examine one element.
    const int64_t offset = i * size;
    if (std::memcmp(a.data() + offset, b.data() + offset, static_cast<size_t>((n - i) * size)) ==
        0) {
      break;
    }
    while (std::memcmp(a.data() + i * size, b.data() + i * size, static_cast<size_t>(size)) == 0) {
      ++i;
    }
    const char* x = a.data() + i * size;
    const char* y = b.data() + i * size;
    if (result_.differing++ == 0) {
      result_.first_index = start + i;
      result_.first_a = FormatElement(dtype_, x);
      result_.first_b = FormatElement(dtype_, y);
    }
    if (is_float) {
      const double u = *FloatValue(dtype_, x), v = *FloatValue(dtype_, y);
      if (std::isfinite(u) && std::isfinite(v)) {
        const double d = std::fabs(u - v);
        result_.max_abs_difference = std::max(result_.max_abs_difference.value_or(0.0), d);
      } else {
        result_.non_finite_difference = true;
      }
    }
    ++i;
  }
}

}  // namespace ckpt
