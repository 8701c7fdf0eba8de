// Host-memory helpers that move bytes between lists of slices (indexed all-to-all packing).
#ifndef CKPT_EXCHANGE_SLICE_COPY_H_
#define CKPT_EXCHANGE_SLICE_COPY_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "exchange/communicator.h"

namespace ckpt {

// Concatenates the slices of `src` into `dst` (which holds TotalBytes(slices) bytes).
void PackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst);

// Scatters consecutive bytes of `src` into the slices of `dst`.
void UnpackSlices(const char* src, absl::Span<const ByteSlice> slices, char* dst);

// Streams the bytes of src_slices (in order) into dst_slices (in order); the slice
// boundaries may differ. InvalidArgument (prefixed with `what`) when the totals differ.
absl::Status CopySlices(const char* src, absl::Span<const ByteSlice> src_slices, char* dst,
                        absl::Span<const ByteSlice> dst_slices, absl::string_view what);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_SLICE_COPY_H_
