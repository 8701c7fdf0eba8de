// ParseSafetensorsHeader: a strict single-pass reader of the JSON a safetensors header is
// (an object of entries and "__metadata__"), linear in the header's size. It builds no JSON
// tree (the nlohmann callback parser walked the whole object once per entry: 128k entries
// took minutes), never recurses (nothing in the format nests deeper than an entry's arrays),
// and stops at the first thing that is not valid JSON or not the format.
#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/safetensors.h"
#include "storage/safetensors_internal.h"

namespace ckpt {
namespace {

using safetensors_internal::Bad;
using safetensors_internal::CheckContiguous;
using safetensors_internal::EntryBytes;
using safetensors_internal::Utf8SequenceLength;

// Most dims a shape may have.
constexpr size_t kMaxDims = 64;

// The header's JSON, read left to right. Every method leaves `pos_` after what it read.
class HeaderReader {
 public:
  HeaderReader(absl::string_view json, absl::string_view file) : s_(json), file_(file) {}

  // The entries (in file order) and metadata, or the first error.
  absl::Status Read(SafetensorsHeader* header);

 private:
  absl::Status Syntax(absl::string_view what) const {
    return Bad(file_, "", absl::StrCat("header is not valid JSON: ", what, " at byte ", pos_));
  }
  // `entry`'s `what` is not what the format wants; at the end of the input that is a
  // truncated header, reported as such.
  absl::Status NotA(absl::string_view entry, absl::string_view what) {
    SkipSpace();
    if (pos_ >= s_.size()) return Syntax("unexpected end");
    return Bad(file_, entry, what);
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  // Skips space; true (and consumes it) if the next character is `c`.
  bool Accept(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  absl::Status Expect(char c) {
    if (Accept(c)) return absl::OkStatus();
    return Syntax(pos_ < s_.size() ? absl::StrCat("expected '", std::string(1, c), "'")
                                   : "unexpected end");
  }
  bool AtString() {
    SkipSpace();
    return pos_ < s_.size() && s_[pos_] == '"';
  }
  absl::Status String(std::string* out);
  absl::Status Escape(std::string* out);
  absl::Status Hex4(uint32_t* out);
  // A non-negative integer (no fraction, no exponent) that fits int64_t.
  absl::Status NonNegative(absl::string_view entry, absl::string_view what, int64_t* out);
  // "[n, n, ...]" of at most `max` non-negative integers.
  absl::Status IntArray(absl::string_view entry, absl::string_view what, size_t max,
                        std::vector<int64_t>* out);
  absl::Status Metadata(std::map<std::string, std::string>* out);
  absl::Status Entry(SafetensorsEntry* e);
  absl::Status EntryField(const std::string& field, SafetensorsEntry* e);

  absl::string_view s_;
  absl::string_view file_;
  size_t pos_ = 0;
};

absl::Status HeaderReader::Hex4(uint32_t* out) {
  if (pos_ + 4 > s_.size()) return Syntax("truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = s_[pos_++];
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v |= c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v |= c - 'A' + 10;
    } else {
      return Syntax("bad hex digit in a \\u escape");
    }
  }
  *out = v;
  return absl::OkStatus();
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// After the backslash.
absl::Status HeaderReader::Escape(std::string* out) {
  if (pos_ >= s_.size()) return Syntax("truncated escape");
  const char c = s_[pos_++];
  switch (c) {
    case '"':
    case '\\':
    case '/':
      out->push_back(c);
      return absl::OkStatus();
    case 'b':
      out->push_back('\b');
      return absl::OkStatus();
    case 'f':
      out->push_back('\f');
      return absl::OkStatus();
    case 'n':
      out->push_back('\n');
      return absl::OkStatus();
    case 'r':
      out->push_back('\r');
      return absl::OkStatus();
    case 't':
      out->push_back('\t');
      return absl::OkStatus();
    case 'u':
      break;
    default:
      return Syntax("unknown escape");
  }
  uint32_t cp;
  CKPT_RETURN_IF_ERROR(Hex4(&cp));
  if (cp >= 0xDC00 && cp <= 0xDFFF) return Syntax("lone low surrogate");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    uint32_t low;
    if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
      return Syntax("high surrogate not followed by a low one");
    }
    pos_ += 2;
    CKPT_RETURN_IF_ERROR(Hex4(&low));
    if (low < 0xDC00 || low > 0xDFFF) return Syntax("high surrogate not followed by a low one");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  AppendUtf8(cp, out);
  return absl::OkStatus();
}

absl::Status HeaderReader::String(std::string* out) {
  out->clear();
  if (!AtString()) return Syntax("expected a string");
  ++pos_;
  while (true) {
    // Plain ASCII runs are copied at once.
    size_t run = pos_;
    while (run < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[run]);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
      ++run;
    }
    out->append(s_.data() + pos_, run - pos_);
    pos_ = run;
    if (pos_ >= s_.size()) return Syntax("unterminated string");
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c == '"') {
      ++pos_;
      return absl::OkStatus();
    }
    if (c == '\\') {
      ++pos_;
      CKPT_RETURN_IF_ERROR(Escape(out));
    } else if (c < 0x20) {
      return Syntax("control character in a string");
    } else {
      const size_t n = Utf8SequenceLength(s_, pos_);
      if (n == 0) return Syntax("invalid UTF-8 in a string");
      out->append(s_.data() + pos_, n);
      pos_ += n;
    }
  }
}

absl::Status HeaderReader::NonNegative(absl::string_view entry, absl::string_view what,
                                       int64_t* out) {
  SkipSpace();
  const size_t start = pos_;
  const bool negative = pos_ < s_.size() && s_[pos_] == '-';
  if (negative) ++pos_;
  if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') {
    pos_ = start;
    return NotA(entry, absl::StrCat(what, " is not a non-negative integer"));
  }
  if (s_[pos_] == '0' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9') {
    return Syntax("number with a leading zero");
  }
  uint64_t v = 0;
  bool overflow = false;
  for (; pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; ++pos_) {
    const uint64_t d = static_cast<uint64_t>(s_[pos_] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) overflow = true;
    v = v * 10 + d;
  }
  if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
    return Bad(file_, entry, absl::StrCat(what, " is not a non-negative integer"));
  }
  if (negative) return Bad(file_, entry, absl::StrCat(what, " is negative"));
  if (overflow || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Bad(file_, entry, absl::StrCat(what, " is too large"));
  }
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

absl::Status HeaderReader::IntArray(absl::string_view entry, absl::string_view what, size_t max,
                                    std::vector<int64_t>* out) {
  out->clear();
  if (!Accept('[')) return NotA(entry, absl::StrCat(what, " is not an array"));
  if (Accept(']')) return absl::OkStatus();
  do {
    if (out->size() == max) {
      return Bad(file_, entry, absl::StrCat(what, " has more than ", max, " elements"));
    }
    int64_t v;
    CKPT_RETURN_IF_ERROR(NonNegative(entry, absl::StrCat("an element of ", what), &v));
    out->push_back(v);
  } while (Accept(','));
  return Expect(']');
}

absl::Status HeaderReader::Metadata(std::map<std::string, std::string>* out) {
  if (!Accept('{')) return NotA("__metadata__", "is not a JSON object");
  if (Accept('}')) return absl::OkStatus();
  std::string key, value;
  do {
    CKPT_RETURN_IF_ERROR(String(&key));
    CKPT_RETURN_IF_ERROR(Expect(':'));
    if (!AtString()) {
      return NotA("__metadata__", absl::StrCat("value of \"", key, "\" is not a string"));
    }
    CKPT_RETURN_IF_ERROR(String(&value));
    if (!out->emplace(key, value).second) {
      return Bad(file_, "__metadata__", absl::StrCat("key \"", key, "\" appears twice"));
    }
  } while (Accept(','));
  return Expect('}');
}

absl::Status HeaderReader::EntryField(const std::string& field, SafetensorsEntry* e) {
  if (field == "dtype") {
    std::string name;
    if (!AtString()) return NotA(e->name, "\"dtype\" is not a string");
    CKPT_RETURN_IF_ERROR(String(&name));
    absl::StatusOr<DType> dt = ParseDType(name);
    if (!dt.ok()) return Bad(file_, e->name, dt.status().message());
    e->dtype = *dt;
    return absl::OkStatus();
  }
  if (field == "shape") {
    return IntArray(e->name, "\"shape\"", kMaxDims, &e->shape);
  }
  if (field == "data_offsets") {
    std::vector<int64_t> offsets;
    absl::Status s = IntArray(e->name, "\"data_offsets\"", 2, &offsets);
    if (s.ok() && offsets.size() != 2) {
      return Bad(file_, e->name, "\"data_offsets\" is not an array of two integers");
    }
    if (s.ok()) {
      e->begin = offsets[0];
      e->end = offsets[1];
    }
    return s;
  }
  return Bad(file_, e->name, absl::StrCat("unknown field \"", field, "\""));
}

absl::Status HeaderReader::Entry(SafetensorsEntry* e) {
  if (!Accept('{')) return NotA(e->name, "entry is not a JSON object");
  static constexpr absl::string_view kFields[] = {"dtype", "shape", "data_offsets"};
  bool has[3] = {false, false, false};
  std::string field;
  if (!Accept('}')) {
    do {
      CKPT_RETURN_IF_ERROR(String(&field));
      CKPT_RETURN_IF_ERROR(Expect(':'));
      const auto* known = std::find(std::begin(kFields), std::end(kFields), field);
      if (known == std::end(kFields)) {
        return Bad(file_, e->name, absl::StrCat("unknown field \"", field, "\""));
      }
      bool& seen = has[known - std::begin(kFields)];
      if (seen) return Bad(file_, e->name, absl::StrCat("field \"", field, "\" appears twice"));
      seen = true;
      CKPT_RETURN_IF_ERROR(EntryField(field, e));
    } while (Accept(','));
    CKPT_RETURN_IF_ERROR(Expect('}'));
  }
  if (!has[0] || !has[1] || !has[2]) {
    return Bad(file_, e->name, "entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (e->begin > e->end) {
    return Bad(file_, e->name,
               absl::StrCat("data_offsets [", e->begin, ", ", e->end, "] are out of order"));
  }
  absl::StatusOr<int64_t> bytes = EntryBytes(e->dtype, e->shape);
  if (!bytes.ok()) return Bad(file_, e->name, bytes.status().message());
  if (e->end - e->begin != *bytes) {
    return Bad(file_, e->name,
               absl::StrCat("data_offsets [", e->begin, ", ", e->end, "] hold ", e->end - e->begin,
                            " bytes but dtype ", DTypeName(e->dtype), " and shape ",
                            ShapeString(e->shape), " need ", *bytes));
  }
  return absl::OkStatus();
}

absl::Status HeaderReader::Read(SafetensorsHeader* header) {
  SkipSpace();
  if (pos_ < s_.size() && s_[pos_] != '{') return Bad(file_, "", "header is not a JSON object");
  CKPT_RETURN_IF_ERROR(Expect('{'));
  bool has_metadata = false;
  std::string name;
  if (!Accept('}')) {
    do {
      CKPT_RETURN_IF_ERROR(String(&name));
      CKPT_RETURN_IF_ERROR(Expect(':'));
      if (name == "__metadata__") {
        if (has_metadata) return Bad(file_, name, "entry name appears twice");
        has_metadata = true;
        CKPT_RETURN_IF_ERROR(Metadata(&header->metadata));
        continue;
      }
      SafetensorsEntry e;
      e.name = name;
      CKPT_RETURN_IF_ERROR(Entry(&e));
      header->entries.push_back(std::move(e));
    } while (Accept(','));
    CKPT_RETURN_IF_ERROR(Expect('}'));
  }
  SkipSpace();
  if (pos_ != s_.size()) return Syntax("trailing characters after the header object");
  return absl::OkStatus();
}

// The first name that appears twice, if any (sorting names: n log n).
const std::string* DuplicateName(const std::vector<SafetensorsEntry>& entries) {
  std::vector<const std::string*> names;
  names.reserve(entries.size());
  for (const SafetensorsEntry& e : entries) names.push_back(&e.name);
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t i = 1; i < names.size(); ++i) {
    if (*names[i] == *names[i - 1]) return names[i];
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size,
                                                         absl::string_view file) {
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return Bad(file, "", "header exceeds the size limit");
  }
  if (file_size < static_cast<int64_t>(8 + json.size())) {
    return Bad(file, "", "file is shorter than its header");
  }
  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(json.size());
  CKPT_RETURN_IF_ERROR(HeaderReader(json, file).Read(&header));
  if (const std::string* dup = DuplicateName(header.entries)) {
    return Bad(file, *dup, "entry name appears twice");
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
