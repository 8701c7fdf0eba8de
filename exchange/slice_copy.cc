#include "exchange/slice_copy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt {

void PackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst) {
  for (const ByteSlice& s : slices) {
    if (s.length == 0) continue;
    std::memcpy(dst, src + s.offset, s.length);
    dst += s.length;
  }
}

void UnpackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst) {
  for (const ByteSlice& s : slices) {
    if (s.length == 0) continue;
    std::memcpy(dst + s.offset, src, s.length);
    src += s.length;
  }
}

absl::StatusOr<std::vector<SegmentCopy>> MatchSlices(absl::Span<const ByteSlice> src_slices,
                                                     absl::Span<const ByteSlice> dst_slices,
                                                     absl::string_view what) {
  size_t src_total = TotalBytes(src_slices);
  size_t dst_total = TotalBytes(dst_slices);
  if (src_total != dst_total) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", src_total, " bytes sent but receive slices hold ", dst_total));
  }
  std::vector<SegmentCopy> copies;
  size_t si = 0, di = 0, s_used = 0, d_used = 0;
  while (si < src_slices.size() && di < dst_slices.size()) {
    size_t s_left = src_slices[si].length - s_used;
    size_t d_left = dst_slices[di].length - d_used;
    size_t n = std::min(s_left, d_left);
    if (n > 0) {
      copies.push_back({src_slices[si].offset + s_used, dst_slices[di].offset + d_used, n});
    }
    s_used += n;
    d_used += n;
    if (s_used == src_slices[si].length) {
      ++si;
      s_used = 0;
    }
    if (d_used == dst_slices[di].length) {
      ++di;
      d_used = 0;
    }
  }
  return copies;
}

absl::Status CopySlices(const char* src, absl::Span<const ByteSlice> src_slices, char* dst,
                        absl::Span<const ByteSlice> dst_slices, absl::string_view what) {
  auto copies = MatchSlices(src_slices, dst_slices, what);
  if (!copies.ok()) return copies.status();
  for (const SegmentCopy& c : *copies) {
    std::memmove(dst + c.dst_offset, src + c.src_offset, c.length);
  }
  return absl::OkStatus();
}

}  // namespace ckpt
