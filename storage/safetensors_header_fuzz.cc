// Fuzz target: a whole safetensors file (8-byte length, JSON header, data) through the header
// parser. Anything may be rejected; an accepted header must describe the file exactly (entries
// sorted, contiguous from 0, ending at the file's end, sizes matching dtype and shape), and must
// survive re-encoding: EncodeSafetensorsHeader of what was read parses back to the same entries
// and metadata. Any violation aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "storage/safetensors.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "safetensors_header_fuzz: %s\n", what);
  std::abort();
}

bool SameEntries(const ckpt::SafetensorsHeader& a, const ckpt::SafetensorsHeader& b) {
  if (a.entries.size() != b.entries.size() || a.metadata != b.metadata) return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto& x = a.entries[i];
    const auto& y = b.entries[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin ||
        x.end != y.end) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  const int64_t file_size = static_cast<int64_t>(size);
  auto n = ckpt::ParseSafetensorsPrefix(file.substr(0, 8), file_size, "fuzz.safetensors");
  if (!n.ok()) return 0;
  Check(*n <= size - 8, "prefix accepted a header longer than the file");
  auto header = ckpt::ParseSafetensorsHeader(file.substr(8, *n), file_size, "fuzz.safetensors");
  if (!header.ok()) {
    Check(!header.status().message().empty(), "an error without a message");
    return 0;
  }
  Check(header->data_start == static_cast<int64_t>(8 + *n), "data start is not after the header");
  int64_t pos = 0;
  for (const ckpt::SafetensorsEntry& e : header->entries) {
    Check(e.begin == pos && e.begin <= e.end, "entries are not contiguous and sorted");
    auto elements = ckpt::CheckedNumElements(e.shape);
    Check(elements.ok() && *elements * ckpt::DTypeSize(e.dtype) == e.end - e.begin,
          "an entry's size does not match its dtype and shape");
    Check(ckpt::IsValidUtf8(e.name), "an entry name is not valid UTF-8");
    pos = e.end;
  }
  Check(pos == header->data_bytes && header->data_start + pos == file_size,
        "entries do not end at the end of the file");

  // Re-encode what was read and parse it again.
  auto encoded = ckpt::EncodeSafetensorsHeader(header->entries, header->metadata);
  Check(encoded.ok(), "an accepted header cannot be encoded again");
  std::string again = *encoded;
  again.append(static_cast<size_t>(header->data_bytes), '\0');
  auto n2 = ckpt::ParseSafetensorsPrefix(again.substr(0, 8), again.size(), "again");
  Check(n2.ok(), "the re-encoded prefix is rejected");
  auto reparsed = ckpt::ParseSafetensorsHeader(absl::string_view(again).substr(8, *n2),
                                               static_cast<int64_t>(again.size()), "again");
  Check(reparsed.ok(), "the re-encoded header is rejected");
  Check(SameEntries(*header, *reparsed), "the re-encoded header reads differently");
  return 0;
}
