#include "exchange/communicator.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "device";
}

absl::Status Communicator::AllGather(const void* send, size_t bytes, void* recv,
                                     absl::Time deadline) {
  std::vector<size_t> counts(size(), bytes);
  return AllGatherV(send, counts, recv, deadline);
}

absl::Status CheckRank(absl::string_view op, absl::string_view what, int rank, int size) {
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " ", rank, " is not a rank of this group of ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(absl::string_view op, absl::string_view what,
                         absl::Span<const size_t> counts, int size) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " has ", counts.size(),
                                                   " entries but the group has ", size, " ranks"));
  }
  return absl::OkStatus();
}

absl::Status CheckSlices(absl::string_view op, absl::string_view what,
                         absl::Span<const std::vector<ByteSlice>> slices, int size) {
  if (static_cast<int>(slices.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", what, " has ", slices.size(), " peer lists but the group has ", size, " ranks"));
  }
  return absl::OkStatus();
}

size_t TotalBytes(absl::Span<const size_t> counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

size_t TotalBytes(absl::Span<const ByteSlice> slices) {
  size_t total = 0;
  for (const ByteSlice& s : slices) total += s.length;
  return total;
}

}  // namespace ckpt
