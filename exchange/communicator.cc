#include "exchange/communicator.h"

#include <cstring>
#include <memory>
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

absl::Status Communicator::AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                            absl::Span<const RecvBuffer> recvs,
                                            absl::Time deadline) {
  const std::string op = absl::StrCat(backend_name(), " all_to_all_v_buffers");
  if (memory_kind() != MemoryKind::kHost) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the packing fallback works on host memory only"));
  }
  if (static_cast<int>(sends.size()) != size() || static_cast<int>(recvs.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", sends.size(), " sends and ",
                                                   recvs.size(), " receives for a group of ",
                                                   size(), " ranks"));
  }
  std::vector<size_t> send_counts(size()), recv_counts(size());
  for (int p = 0; p < size(); ++p) {
    send_counts[p] = sends[p].bytes;
    recv_counts[p] = recvs[p].bytes;
  }
  std::unique_ptr<char[]> send(new char[TotalBytes(send_counts)]);
  std::unique_ptr<char[]> recv(new char[TotalBytes(recv_counts)]);
  size_t at = 0;
  for (const SendBuffer& b : sends) {
    if (b.bytes > 0) std::memcpy(send.get() + at, b.data, b.bytes);
    at += b.bytes;
  }
  absl::Status status = AllToAllV(send.get(), send_counts, recv.get(), recv_counts, deadline);
  if (!status.ok()) return status;
  at = 0;
  for (const RecvBuffer& b : recvs) {
    if (b.bytes > 0) std::memcpy(b.data, recv.get() + at, b.bytes);
    at += b.bytes;
  }
  return absl::OkStatus();
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
