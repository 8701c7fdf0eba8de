#include "storage/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/safetensors_internal.h"

namespace ckpt {
namespace safetensors_internal {

absl::Status Bad(absl::string_view file, absl::string_view entry, absl::string_view what) {
  if (entry.empty()) {
    return absl::DataLossError(absl::StrCat("safetensors file ", file, ": ", what));
  }
  return absl::DataLossError(
      absl::StrCat("safetensors file ", file, ", entry \"", entry, "\": ", what));
}

size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

absl::StatusOr<int64_t> EntryBytes(DType dtype, const std::vector<int64_t>& shape) {
  CKPT_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
  const int64_t size = DTypeSize(dtype);
  if (n > std::numeric_limits<int64_t>::max() / size) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " of dtype ",
                                                   DTypeName(dtype), " overflows 64-bit bytes"));
  }
  return n * size;
}

absl::StatusOr<int64_t> CheckContiguous(const std::vector<SafetensorsEntry>& sorted,
                                        absl::string_view file) {
  int64_t pos = 0;
  for (const SafetensorsEntry& e : sorted) {
    if (e.begin < pos) {
      return Bad(file, e.name,
                 absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                              "] overlap the previous entry, which ends at ", pos));
    }
    if (e.begin > pos) {
      return Bad(file, e.name,
                 absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] leave a gap after ", pos,
                              " (entries must be contiguous)"));
    }
    pos = e.end;
  }
  return pos;
}

}  // namespace safetensors_internal

namespace {

using safetensors_internal::Bad;
using safetensors_internal::CheckContiguous;
using safetensors_internal::EntryBytes;
using safetensors_internal::Utf8SequenceLength;

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') {
      out->append("\\\"");
    } else if (c == '\\') {
      out->append("\\\\");
    } else if (c < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xF]);
    } else {
      out->push_back(ch);
    }
  }
  out->push_back('"');
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EncodeEntryName(absl::string_view key, const Region& region) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size() + 16 * region.lengths.size() + 8);
  for (size_t i = 0; i < key.size();) {
    const size_t n = Utf8SequenceLength(key, i);
    const auto c = static_cast<unsigned char>(key[i]);
    if (n == 0 || c < 0x20 || c == 0x7F || c == '%' || c == '|') {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
      ++i;
    } else {
      out.append(key.data() + i, n);
      i += n;
    }
  }
  out.push_back('|');
  for (int d = 0; d < region.ndim(); ++d) {
    const int64_t off = d < static_cast<int>(region.offsets.size()) ? region.offsets[d] : 0;
    if (d > 0) out.push_back(',');
    absl::StrAppend(&out, off, ":", off + region.lengths[d]);
  }
  if (region.flat) absl::StrAppend(&out, "|flat=", region.flat->start, ":", region.flat->stop);
  return out;
}

std::vector<int64_t> EntryShape(const Region& region) {
  if (region.flat) return {region.flat->size()};
  return region.lengths;
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata, int64_t data_alignment) {
  if (data_alignment < kSafetensorsDataAlignment ||
      data_alignment % kSafetensorsDataAlignment != 0 || data_alignment > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors data alignment ", data_alignment, " is not a multiple of 8"));
  }
  std::vector<SafetensorsEntry> sorted = entries;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.begin < b.begin; });
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(entries.size());
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || !IsValidUtf8(e.name) || !names.insert(e.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("cannot encode safetensors entry \"", e.name,
                                                     "\": duplicate, reserved or not valid UTF-8"));
    }
    if (e.begin > e.end) {
      return absl::InvalidArgumentError(absl::StrCat("entry \"", e.name, "\" has begin > end"));
    }
    CKPT_ASSIGN_OR_RETURN(int64_t bytes, EntryBytes(e.dtype, e.shape));
    if (e.end - e.begin != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("entry \"", e.name, "\" spans ",
                                                     e.end - e.begin, " bytes but needs ", bytes));
    }
  }
  auto contiguous = CheckContiguous(sorted, "<being written>");
  if (!contiguous.ok()) return absl::InvalidArgumentError(contiguous.status().message());
  for (const auto& [k, v] : metadata) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors metadata \"", k, "\" is not valid UTF-8"));
    }
  }

  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json.append("\"__metadata__\":{");
    bool first_md = true;
    for (const auto& [k, v] : metadata) {
      if (!first_md) json.push_back(',');
      first_md = false;
      AppendJsonString(k, &json);
      json.push_back(':');
      AppendJsonString(v, &json);
    }
    json.push_back('}');
    first = false;
  }
  for (const SafetensorsEntry& e : entries) {
    if (!first) json.push_back(',');
    first = false;
    AppendJsonString(e.name, &json);
    absl::StrAppend(&json, ":{\"dtype\":\"", DTypeName(e.dtype), "\",\"shape\":[",
                    absl::StrJoin(e.shape, ","), "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  }
  json.push_back('}');
  const size_t align = static_cast<size_t>(data_alignment);
  const size_t padded = (8 + json.size() + align - 1) / align * align - 8;
  json.append(padded - json.size(), ' ');
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header of ", json.size(), " bytes exceeds the limit of ",
                     kMaxSafetensorsHeaderBytes, " (too many entries in one file)"));
  }
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out.append(json);
  return out;
}

absl::StatusOr<uint64_t> ParseSafetensorsPrefix(absl::string_view first8, int64_t file_size,
                                                absl::string_view file) {
  if (first8.size() < 8 || file_size < 8) {
    return Bad(file, "", "file is shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(first8[i])} << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Bad(
        file, "",
        absl::StrCat("header length ", n, " exceeds the limit of ", kMaxSafetensorsHeaderBytes));
  }
  if (n > static_cast<uint64_t>(file_size - 8)) {
    return Bad(file, "",
               absl::StrCat("header length ", n, " runs past the end of the ", file_size,
                            "-byte file (truncated?)"));
  }
  return n;
}

}  // namespace ckpt
