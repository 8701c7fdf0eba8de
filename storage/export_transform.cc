#include "storage/export_transform.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

double Decode(DType dtype, const char* p) {
  switch (dtype) {
    case DType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
    }
    default: {  // F16
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int exponent = (h >> 10) & 0x1f;
      const int mantissa = h & 0x3ff;
      double v;
      if (exponent == 0x1f) {
        v = mantissa ? NAN : INFINITY;
      } else if (exponent == 0) {
        v = std::ldexp(mantissa, -24);
      } else {
        v = std::ldexp(mantissa | 0x400, exponent - 25);
      }
      return (h & 0x8000) ? -v : v;
    }
  }
}

// Rounds |v| (finite, >= 0) to a float format of `mantissa_bits` explicit bits and exponent
// range [min_exponent, max_exponent] (of the leading bit, normal numbers), nearest even.
// Returns the bits without sign; overflow gives the infinity pattern.
uint32_t EncodeMagnitude(double v, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint32_t inf = ((1u << exponent_bits) - 1) << mantissa_bits;
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1): leading bit at 2^(e-1)
  int exponent = e - 1;
  const int min_normal = 1 - bias;
  // The value of one unit in the last place, for this exponent (subnormals: fixed).
  const int ulp_exponent = std::max(exponent, min_normal) - mantissa_bits;
  const double units = std::ldexp(v, -ulp_exponent);  // exact: a scaling by a power of 2
  double rounded = std::nearbyint(units);             // default mode: nearest even
  if (rounded == 0) return 0;
  // Rounding may carry into the next binade.
  uint64_t q = static_cast<uint64_t>(rounded);
  if (exponent < min_normal) {        // subnormal (or rounded up to the smallest normal)
    return static_cast<uint32_t>(q);  // q < 2^mantissa_bits, or == it: the smallest normal
  }
  if (q >> (mantissa_bits + 1)) {  // carried to 2^(mantissa_bits+1)
    q >>= 1;
    ++exponent;
  }
  const int biased = exponent + bias;
  if (biased >= (1 << exponent_bits) - 1) return inf;
  return (static_cast<uint32_t>(biased) << mantissa_bits) |
         static_cast<uint32_t>(q & ((1u << mantissa_bits) - 1));
}

void Encode(DType dtype, double v, char* p) {
  switch (dtype) {
    case DType::kF64:
      std::memcpy(p, &v, 8);
      return;
    case DType::kF32: {
      const float f = static_cast<float>(v);  // round to nearest even
      std::memcpy(p, &f, 4);
      return;
    }
    default:
      break;
  }
  const bool bf16 = dtype == DType::kBF16;
  const int exponent_bits = bf16 ? 8 : 5, mantissa_bits = bf16 ? 7 : 10;
  uint32_t bits;
  if (std::isnan(v)) {
    bits = (((1u << exponent_bits) - 1) << mantissa_bits) | (1u << (mantissa_bits - 1));
  } else if (std::isinf(v)) {
    bits = ((1u << exponent_bits) - 1) << mantissa_bits;
  } else {
    bits = EncodeMagnitude(std::fabs(v), exponent_bits, mantissa_bits);
  }
  if (std::signbit(v)) bits |= 0x8000;
  const uint16_t h = static_cast<uint16_t>(bits);
  std::memcpy(p, &h, 2);
}

}  // namespace

bool IsConvertibleFloat(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

DType ExportedDType(DType dtype, std::optional<DType> target) {
  return target && IsConvertibleFloat(dtype) ? *target : dtype;
}

void ConvertFloats(DType from, DType to, const char* in, char* out, int64_t count) {
  const int64_t in_size = DTypeSize(from), out_size = DTypeSize(to);
  if (from == to) {
    std::memcpy(out, in, static_cast<size_t>(count * in_size));
    return;
  }
  for (int64_t i = 0; i < count; ++i)
    Encode(to, Decode(from, in + i * in_size), out + i * out_size);
}

absl::StatusOr<std::map<std::string, std::string>> ParseKeyMapping(absl::string_view json,
                                                                   absl::string_view source) {
  nlohmann::json parsed = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a key mapping is one JSON object {\"old key\": \"new key\", ...}"));
  }
  std::map<std::string, std::string> mapping;
  std::map<std::string, std::string> by_new;
  for (auto it = parsed.begin(); it != parsed.end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"", it.key(), "\" must map to a non-empty string"));
    }
    const std::string target = it.value().get<std::string>();
    auto [other, fresh] = by_new.emplace(target, it.key());
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": \"", other->second, "\" and \"",
                                                     it.key(), "\" both map to \"", target, "\""));
    }
    mapping[it.key()] = target;
  }
  return mapping;
}

absl::StatusOr<std::vector<std::string>> RenameKeys(
    const std::vector<std::string>& keys, const std::map<std::string, std::string>& mapping) {
  const std::set<std::string> present(keys.begin(), keys.end());
  for (const auto& [old_key, new_key] : mapping) {
    if (!present.count(old_key)) {
      return absl::InvalidArgumentError(absl::StrCat("the key mapping renames \"", old_key,
                                                     "\", which the checkpoint does not hold"));
    }
  }
  std::vector<std::string> names;
  std::map<std::string, std::string> owner;
  for (const std::string& key : keys) {
    auto it = mapping.find(key);
    names.push_back(it == mapping.end() ? key : it->second);
    auto [other, fresh] = owner.emplace(names.back(), key);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat("tensors \"", other->second, "\" and \"", key,
                                                     "\" would both be exported as \"",
                                                     names.back(), "\""));
    }
  }
  return names;
}

}  // namespace ckpt
