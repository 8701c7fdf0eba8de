#include "storage/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view file, absl::string_view entry, absl::string_view what) {
  if (entry.empty()) {
    return absl::DataLossError(absl::StrCat("safetensors file ", file, ": ", what));
  }
  return absl::DataLossError(
      absl::StrCat("safetensors file ", file, ", entry \"", entry, "\": ", what));
}

// Length in bytes of the UTF-8 sequence starting at s[i], or 0 if it is not well formed.
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

// Entry byte size for dtype and shape, or an error on overflow / invalid shape.
absl::StatusOr<int64_t> EntryBytes(DType dtype, const std::vector<int64_t>& shape) {
  CKPT_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
  const int64_t size = DTypeSize(dtype);
  if (n > std::numeric_limits<int64_t>::max() / size) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " of dtype ",
                                                   DTypeName(dtype), " overflows 64-bit bytes"));
  }
  return n * size;
}

absl::StatusOr<int64_t> NonNegativeInt(const Json& v, absl::string_view what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is too large"));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is negative"));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " is not a non-negative integer"));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& v,
                                            absl::string_view file) {
  SafetensorsEntry e;
  e.name = name;
  if (!v.is_object()) return Bad(file, name, "entry is not a JSON object");
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& field = it.key();
    const Json& fv = it.value();
    if (field == "dtype") {
      has_dtype = true;
      if (!fv.is_string()) return Bad(file, name, "\"dtype\" is not a string");
      auto dt = ParseDType(fv.get_ref<const std::string&>());
      if (!dt.ok()) return Bad(file, name, dt.status().message());
      e.dtype = *dt;
    } else if (field == "shape") {
      has_shape = true;
      if (!fv.is_array()) return Bad(file, name, "\"shape\" is not an array");
      if (fv.size() > 64) return Bad(file, name, "\"shape\" has more than 64 dims");
      for (const Json& d : fv) {
        auto dim = NonNegativeInt(d, "a shape dimension");
        if (!dim.ok()) return Bad(file, name, dim.status().message());
        e.shape.push_back(*dim);
      }
    } else if (field == "data_offsets") {
      has_offsets = true;
      if (!fv.is_array() || fv.size() != 2) {
        return Bad(file, name, "\"data_offsets\" is not an array of two integers");
      }
      auto b = NonNegativeInt(fv[0], "data_offsets[0]");
      if (!b.ok()) return Bad(file, name, b.status().message());
      auto en = NonNegativeInt(fv[1], "data_offsets[1]");
      if (!en.ok()) return Bad(file, name, en.status().message());
      e.begin = *b;
      e.end = *en;
    } else {
      return Bad(file, name, absl::StrCat("unknown field \"", field, "\""));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    return Bad(file, name, "entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (e.begin > e.end) {
    return Bad(file, name,
               absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] are out of order"));
  }
  auto bytes = EntryBytes(e.dtype, e.shape);
  if (!bytes.ok()) return Bad(file, name, bytes.status().message());
  if (e.end - e.begin != *bytes) {
    return Bad(file, name,
               absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                            " bytes but dtype ", DTypeName(e.dtype), " and shape ",
                            ShapeString(e.shape), " need ", *bytes));
  }
  return e;
}

// Checks sorted entries are contiguous from 0; returns the end of the last one.
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
  std::set<absl::string_view> names;
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

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size,
                                                         absl::string_view file) {
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return Bad(file, "", "header exceeds the size limit");
  }
  if (file_size < static_cast<int64_t>(8 + json.size())) {
    return Bad(file, "", "file is shorter than its header");
  }
  // Duplicate top-level names would silently collapse in a JSON object: detect them while
  // parsing. Nesting deeper than entry fields is rejected too.
  std::set<std::string> seen;
  std::string duplicate;
  bool too_deep = false;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > 3) too_deep = true;
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  Json root = Json::parse(json.begin(), json.end(), cb, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad(file, "", "header is not valid JSON");
  if (too_deep) return Bad(file, "", "header JSON is nested too deeply");
  if (!duplicate.empty()) return Bad(file, duplicate, "entry name appears twice");
  if (!root.is_object()) return Bad(file, "", "header is not a JSON object");

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(json.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Bad(file, "__metadata__", "is not a JSON object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Bad(file, "__metadata__",
                     absl::StrCat("value of \"", m.key(), "\" is not a string"));
        }
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(it.key(), it.value(), file));
    header.entries.push_back(std::move(e));
  }
  std::sort(header.entries.begin(), header.entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  CKPT_ASSIGN_OR_RETURN(header.data_bytes, CheckContiguous(header.entries, file));
  const int64_t available = file_size - header.data_start;
  if (header.data_bytes != available) {
    if (header.data_bytes > available) {
      const SafetensorsEntry& last = header.entries.back();
      return Bad(file, last.name,
                 absl::StrCat("data ends at ", header.data_bytes, " but the file has only ",
                              available, " data bytes (truncated?)"));
    }
    return Bad(
        file, "",
        absl::StrCat("file has ", available - header.data_bytes, " bytes after the last entry"));
  }
  return header;
}

}  // namespace ckpt
