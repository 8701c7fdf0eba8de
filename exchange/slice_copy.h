// Host-memory helpers that move bytes between lists of slices (indexed all-to-all packing).
#ifndef CKPT_EXCHANGE_SLICE_COPY_H_
#define CKPT_EXCHANGE_SLICE_COPY_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "exchange/communicator.h"

namespace ckpt {

// Concatenates the slices of `src` into `dst` (which holds TotalBytes(slices) bytes).
void PackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst);

// Scatters consecutive bytes of `src` into the slices of `dst`.
void UnpackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst);

// One contiguous copy: `length` bytes from src offset to dst offset.
struct SegmentCopy {
  size_t src_offset = 0;
  size_t dst_offset = 0;
  size_t length = 0;
};

// The copies that stream src_slices (in order) into dst_slices (in order) when their slice
// boundaries differ. InvalidArgument (prefixed with `what`) when the totals differ.
absl::StatusOr<std::vector<SegmentCopy>> MatchSlices(absl::Span<const ByteSlice> src_slices,
                                                     absl::Span<const ByteSlice> dst_slices,
                                                     absl::string_view what);

// Streams the bytes of src_slices (in order) into dst_slices (in order); the slice
// boundaries may differ. InvalidArgument (prefixed with `what`) when the totals differ.
absl::Status CopySlices(const char* src, absl::Span<const ByteSlice> src_slices, char* dst,
                        absl::Span<const ByteSlice> dst_slices, absl::string_view what);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_SLICE_COPY_H_
