// The safetensors container format, as our data files use it: an 8-byte little-endian header
// length, a JSON header (one entry per tensor with "dtype", "shape", "data_offsets", plus a
// "__metadata__" string map), padding spaces so the data starts 8-byte aligned, then the bytes.
// Pure codec: no I/O. Parsing is strict and bounded (see ParseSafetensorsHeader).
#ifndef CKPT_STORAGE_SAFETENSORS_H_
#define CKPT_STORAGE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/dtype.h"
#include "sharding/region.h"

namespace ckpt {

// Largest JSON header we accept (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Data starts at a multiple of this (header padded with spaces).
inline constexpr int64_t kSafetensorsDataAlignment = 8;

// One tensor entry. begin/end are byte offsets relative to the start of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
};

// A parsed header: entries sorted by begin offset, the metadata map, and where data starts.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // absolute file offset of the data section (8 + JSON length)
  int64_t data_bytes = 0;  // size of the data section (end of the last entry)
};

// Encodes the 8-byte length + JSON header (+ space padding). Entries are written in the order
// given; their offsets must already be consistent (validated: contiguous from 0, sizes match
// dtype and shape). Names and metadata must be valid UTF-8. The header is padded with spaces
// so the data starts at a multiple of `data_alignment` (a multiple of 8; the checkpoint writer
// uses 4096 so O_DIRECT can write pieces straight from memory).
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata,
    int64_t data_alignment = kSafetensorsDataAlignment);

// Reads the 8-byte little-endian prefix. `file_size` bounds the header; `file` names the file
// in errors.
absl::StatusOr<uint64_t> ParseSafetensorsPrefix(absl::string_view first8, int64_t file_size,
                                                absl::string_view file);

// Parses and validates the JSON header `json` of a file of `file_size` bytes: known dtypes,
// non-negative shapes, data_offsets [begin, end] with begin <= end, end - begin equal to
// elements * dtype size, entries non-overlapping and contiguous from 0 to the end of the file,
// no duplicate names, no unknown fields. Errors name the file and entry.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size,
                                                         absl::string_view file);

// Entry name of a stored piece: the escaped key, '|', the box as "start:stop" per dim joined
// by ',', and "|flat=start:stop" when the region has a flat range. E.g.
// "decoder.layers.0.mlp.w|0:128,0:4096" or "emb|0:10,0:4|flat=3:40". In the key, '%', '|',
// control characters and bytes that are not valid UTF-8 are written %XX.
std::string EncodeEntryName(absl::string_view key, const Region& region);

// The safetensors shape of a stored piece: the box lengths, or [flat size] for a flat piece.
std::vector<int64_t> EntryShape(const Region& region);

// True if `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(absl::string_view s);

}  // namespace ckpt

#endif  // CKPT_STORAGE_SAFETENSORS_H_
