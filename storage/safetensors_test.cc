#include "storage/safetensors.h"

#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// Parses a whole in-memory file the way the reader does: prefix, then header.
absl::StatusOr<SafetensorsHeader> ParseFile(const std::string& bytes) {
  auto n = ParseSafetensorsPrefix(bytes, static_cast<int64_t>(bytes.size()), "f.safetensors");
  if (!n.ok()) return n.status();
  return ParseSafetensorsHeader(absl::string_view(bytes).substr(8, *n),
                                static_cast<int64_t>(bytes.size()), "f.safetensors");
}

std::string MakeFile(const std::vector<SafetensorsEntry>& entries,
                     const std::map<std::string, std::string>& md = {}) {
  auto header = EncodeSafetensorsHeader(entries, md);
  EXPECT_TRUE(header.ok()) << header.status();
  int64_t end = 0;
  for (const auto& e : entries) end = std::max(end, e.end);
  std::string data(end, '\0');
  for (int64_t i = 0; i < end; ++i) data[i] = static_cast<char>(i * 7);
  return *header + data;
}

// A file with a raw JSON header (padded like the encoder does) and `data_bytes` zero bytes.
std::string RawFile(std::string json, int64_t data_bytes) {
  while ((8 + json.size()) % 8) json.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json + std::string(data_bytes, '\0');
}

std::vector<SafetensorsEntry> SampleEntries() {
  return {{"a|0:2,0:3", DType::kF32, {2, 3}, 0, 24},
          {"b|", DType::kBF16, {}, 24, 26},
          {"c|0:0", DType::kI64, {0}, 26, 26},
          {"d|0:4|flat=1:3", DType::kU8, {2}, 26, 28}};
}

TEST(SafetensorsTest, EncodedHeaderRoundTripsAndAlignsData) {
  std::string file = MakeFile(SampleEntries(), {{"format", "ckpt"}, {"note", "q\"uote\n"}});
  auto h = ParseFile(file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_start % 8, 0);
  EXPECT_EQ(h->data_bytes, 28);
  ASSERT_EQ(h->entries.size(), 4u);
  EXPECT_EQ(h->entries[0].name, "a|0:2,0:3");
  EXPECT_EQ(h->entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h->entries[1].dtype, DType::kBF16);
  EXPECT_TRUE(h->entries[1].shape.empty());
  EXPECT_EQ(h->metadata.at("note"), "q\"uote\n");
  // Padding is spaces, as safetensors does it.
  EXPECT_EQ(file[h->data_start - 1], file[h->data_start - 1] == '}' ? '}' : ' ');
}

TEST(SafetensorsTest, EveryDTypeRoundTrips) {
  for (DType d : kAllDTypes) {
    std::vector<SafetensorsEntry> e = {{"x|0:3", d, {3}, 0, 3 * DTypeSize(d)}};
    auto h = ParseFile(MakeFile(e));
    ASSERT_TRUE(h.ok()) << DTypeName(d) << ": " << h.status();
    EXPECT_EQ(h->entries[0].dtype, d);
  }
}

TEST(SafetensorsTest, EntryNamesEncodeKeyAndRegionReadably) {
  Region box{{0, 128}, {128, 3968}, std::nullopt};
  EXPECT_EQ(EncodeEntryName("decoder.layers.0.mlp.w", box),
            "decoder.layers.0.mlp.w|0:128,128:4096");
  Region flat{{0}, {40}, FlatRange{3, 40}};
  EXPECT_EQ(EncodeEntryName("emb", flat), "emb|0:40|flat=3:40");
  EXPECT_EQ(EncodeEntryName("scalar", Region{}), "scalar|");
  EXPECT_EQ(EncodeEntryName("a|b%c\n", Region{}), "a%7Cb%25c%0A|");
  EXPECT_EQ(EncodeEntryName("gewicht.ü.层", Region{}), "gewicht.ü.层|");
  EXPECT_EQ(EncodeEntryName(std::string("x\xff", 2), Region{}), "x%FF|");
  EXPECT_EQ(EncodeEntryName("../../etc/passwd", Region{}), "../../etc/passwd|");
}

TEST(SafetensorsTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain ü 层 😀"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xe4\xb8"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
}

TEST(SafetensorsTest, EncoderRejectsInconsistentEntries) {
  EXPECT_FALSE(EncodeSafetensorsHeader({{"a", DType::kF32, {2}, 0, 4}}, {}).ok());
  EXPECT_FALSE(EncodeSafetensorsHeader({{"a", DType::kU8, {2}, 1, 3}}, {}).ok());
  EXPECT_FALSE(
      EncodeSafetensorsHeader({{"a", DType::kU8, {1}, 0, 1}, {"a", DType::kU8, {1}, 1, 2}}, {})
          .ok());
  EXPECT_FALSE(EncodeSafetensorsHeader({{"\xff", DType::kU8, {1}, 0, 1}}, {}).ok());
}

struct BadCase {
  const char* what;
  std::string json;
  int64_t data_bytes;
  const char* message;
};

TEST(SafetensorsTest, StrictParserRejectsBadHeadersNamingFileAndEntry) {
  const std::vector<BadCase> cases = {
      {"overlap",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
       6, "overlap"},
      {"gap", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6, "gap"},
      {"out of file", R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4, "truncated"},
      {"trailing", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8,
       "after the last entry"},
      {"out of order", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4,
       "out of order"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "need 8"},
      {"dtype", R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16, "unknown dtype"},
      {"negative dim", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0, "negative"},
      {"float dim", R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", 0,
       "not a non-negative integer"},
      {"unknown field", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1,
       "unknown field"},
      {"missing field", R"({"a":{"dtype":"U8","shape":[1]}})", 1, "needs"},
      {"duplicate",
       R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, "twice"},
      {"not json", R"({"a":)", 0, "not valid JSON"},
      {"not object", R"([1,2])", 0, "not a JSON object"},
      {"metadata", R"({"__metadata__":{"k":1}})", 0, "not a string"},
      {"huge shape",
       R"({"a":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", 0,
       "2^62"},
      {"deep", R"({"a":{"dtype":"U8","shape":[[[[1]]]],"data_offsets":[0,1]}})", 1,
       "not a non-negative integer"},
  };
  for (const BadCase& c : cases) {
    auto h = ParseFile(RawFile(c.json, c.data_bytes));
    ASSERT_FALSE(h.ok()) << c.what;
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("f.safetensors")) << c.what;
    EXPECT_THAT(std::string(h.status().message()), HasSubstr(c.message)) << c.what;
  }
}

TEST(SafetensorsTest, PrefixBoundsHeaderLength) {
  std::string file = MakeFile(SampleEntries());
  EXPECT_THAT(std::string(ParseFile(file.substr(0, 5)).status().message()), HasSubstr("shorter"));
  EXPECT_THAT(std::string(ParseFile(file.substr(0, 20)).status().message()),
              HasSubstr("past the end"));
  std::string huge = file;
  huge[7] = '\x01';
  EXPECT_THAT(std::string(ParseFile(huge).status().message()), HasSubstr("limit"));
}

// Random byte flips and truncations must produce errors or valid headers that stay inside
// the file; never a crash or an out-of-bounds read (this target also runs under ASan).
TEST(SafetensorsTest, FuzzedFilesNeverCrashAndStayInBounds) {
  const std::string good = MakeFile(SampleEntries(), {{"format", "ckpt"}});
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = good;
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xFF);
    }
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    // Exact-size heap copy so ASan sees any read past the end.
    std::unique_ptr<char[]> exact(new char[bytes.size()]);
    std::memcpy(exact.get(), bytes.data(), bytes.size());
    auto h = ParseFile(std::string(exact.get(), bytes.size()));
    if (!h.ok()) {
      ++rejected;
      continue;
    }
    for (const auto& e : h->entries) {
      ASSERT_LE(h->data_start + e.end, static_cast<int64_t>(bytes.size()));
      ASSERT_LE(e.begin, e.end);
    }
  }
  EXPECT_GT(rejected, 1000);
}

// The twin: nlohmann's tree parser (trusted; slow on big headers, which is why the parser
// does not use it), duplicate keys detected in every object, then the format's rules on the
// tree. nullopt when it rejects the header.
std::optional<SafetensorsHeader> TwinParse(const std::string& json, int64_t file_size) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> keys;
  bool duplicate = false;
  Json::parser_callback_t cb = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = true;
    }
    return true;
  };
  Json root = Json::parse(json, cb, /*allow_exceptions=*/false);
  if (root.is_discarded() || duplicate || !root.is_object()) return std::nullopt;
  auto uint = [](const Json& v, int64_t* out) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT64_MAX}) return false;
    *out = static_cast<int64_t>(v.get<uint64_t>());
    return true;
  };
  SafetensorsHeader h;
  h.data_start = 8 + static_cast<int64_t>(json.size());
  for (const auto& [name, v] : root.items()) {
    if (!v.is_object()) return std::nullopt;
    if (name == "__metadata__") {
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string()) return std::nullopt;
        h.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    if (v.size() != 3 || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        v["shape"].size() > 64 || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return std::nullopt;
    }
    SafetensorsEntry e;
    e.name = name;
    auto dtype = ParseDType(v["dtype"].get<std::string>());
    if (!dtype.ok()) return std::nullopt;
    e.dtype = *dtype;
    for (const Json& d : v["shape"]) {
      int64_t dim;
      if (!uint(d, &dim)) return std::nullopt;
      e.shape.push_back(dim);
    }
    if (!uint(v["data_offsets"][0], &e.begin) || !uint(v["data_offsets"][1], &e.end) ||
        e.begin > e.end) {
      return std::nullopt;
    }
    auto n = CheckedNumElements(e.shape);
    if (!n.ok() || *n > INT64_MAX / DTypeSize(e.dtype) ||
        e.end - e.begin != *n * DTypeSize(e.dtype)) {
      return std::nullopt;
    }
    h.entries.push_back(e);
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  int64_t pos = 0;
  for (const auto& e : h.entries) {
    if (e.begin != pos) return std::nullopt;
    pos = e.end;
  }
  h.data_bytes = pos;
  if (h.data_start + pos != file_size) return std::nullopt;
  return h;
}

// Edits that keep a header close to valid JSON: byte flips, deletions, insertions of JSON
// punctuation, digits, escapes and multi-byte characters, copied spans.
std::string Mutate(std::string s, std::mt19937& rng) {
  static const std::vector<std::string> kBits = {"{",
                                                 "}",
                                                 "[",
                                                 "]",
                                                 ":",
                                                 ",",
                                                 "\"",
                                                 "\\",
                                                 " ",
                                                 "\n",
                                                 "0",
                                                 "1",
                                                 "9",
                                                 "-",
                                                 ".",
                                                 "e",
                                                 "E",
                                                 "\\u00e9",
                                                 "\\ud83d\\ude00",
                                                 "\\ud800",
                                                 "\\u0000",
                                                 "\xc3\xa9",
                                                 "\xff",
                                                 "\x01",
                                                 "null",
                                                 "true",
                                                 "\"dtype\"",
                                                 "\"shape\"",
                                                 "\"data_offsets\"",
                                                 "\"__metadata__\"",
                                                 "18446744073709551616",
                                                 "9223372036854775808",
                                                 "1.0",
                                                 "-0",
                                                 "00"};
  const int edits = 1 + rng() % 3;
  for (int i = 0; i < edits && !s.empty(); ++i) {
    const size_t at = rng() % s.size();
    switch (rng() % 4) {
      case 0:
        s[at] = static_cast<char>(rng());
        break;
      case 1:
        s.erase(at, 1 + rng() % 3);
        break;
      case 2:
        s.insert(at, kBits[rng() % kBits.size()]);
        break;
      default: {
        const size_t from = rng() % s.size();
        s.insert(at, s.substr(from, rng() % 12));
        break;
      }
    }
  }
  return s;
}

std::string Describe(const std::vector<SafetensorsEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) {
    out.push_back(absl::StrCat(e.name, "/", DTypeName(e.dtype), "/", ShapeString(e.shape), "/",
                               e.begin, "-", e.end));
  }
  std::sort(out.begin(), out.end());
  return absl::StrJoin(out, "; ");
}

// The single-pass parser accepts exactly what the tree twin accepts, and reads the same
// entries and metadata, on tens of thousands of near-valid headers.
TEST(SafetensorsTest, ParserAgreesWithATreeParsingTwin) {
  const std::string valid =
      R"({"__metadata__":{"format":"pt","n\u00e9":"q\"uote\n \ud83d\ude00"},)"
      R"("w\u0000|0:2":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"( "b" : { "shape" : [ 1 , 3 ] , "dtype" : "BF16", "data_offsets" : [ 8 , 14 ] },)"
      R"("e":{"dtype":"I64","shape":[0,5],"data_offsets":[14,14]},)"
      R"("gewicht.ü":{"data_offsets":[14,16],"dtype":"U8","shape":[2]}})";
  constexpr int64_t kData = 16;
  ASSERT_TRUE(TwinParse(valid, 8 + valid.size() + kData).has_value());
  std::mt19937 rng(99);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 30000; ++iter) {
    const std::string json = iter == 0 ? valid : Mutate(valid, rng);
    const int64_t file_size = 8 + static_cast<int64_t>(json.size()) + kData;
    std::optional<SafetensorsHeader> twin = TwinParse(json, file_size);
    auto ours = ParseSafetensorsHeader(json, file_size, "f.safetensors");
    ASSERT_EQ(ours.ok(), twin.has_value()) << "header: " << json << "\nours: " << ours.status();
    if (!ours.ok()) {
      ++rejected;
      EXPECT_THAT(std::string(ours.status().message()), HasSubstr("f.safetensors"));
      continue;
    }
    ++accepted;
    EXPECT_EQ(Describe(ours->entries), Describe(twin->entries)) << json;
    EXPECT_EQ(ours->metadata, twin->metadata) << json;
    EXPECT_EQ(ours->data_bytes, twin->data_bytes);
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 10000);
}

// 1M entries parse in linear time: a benchmark records the figures
// (storage:many_entries_benchmark); this only checks a big header is read correctly.
TEST(SafetensorsTest, AHeaderOfManyEntriesParses) {
  std::vector<SafetensorsEntry> entries;
  for (int64_t i = 0; i < 200000; ++i) {
    entries.push_back({absl::StrCat("t", i), DType::kU8, {1}, i, i + 1});
  }
  auto h = ParseFile(MakeFile(entries));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->entries.size(), entries.size());
  EXPECT_EQ(h->entries.back().name, "t199999");
}

}  // namespace
}  // namespace ckpt
