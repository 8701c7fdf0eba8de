// The data-plane interface: collectives and point-to-point transfers among the N ranks of one
// group. Exchange algorithms are written against this interface only (never against sockets,
// Gloo or NCCL). Backends: exchange/gloo (host memory over TCP) and exchange/nccl (device
// memory), chosen by exchange/communicator_factory.h.
//
// Conventions for every method:
//  - Sizes and offsets are in bytes; buffers live in the backend's memory_kind().
//  - Every rank of the group calls the same collectives in the same order (as with MPI/NCCL).
//  - Every call takes a deadline. A peer that dies yields Unavailable, one that stalls yields
//    DeadlineExceeded; both name the operation and the peer rank. Nothing blocks past the
//    deadline (plus a small transport grace period).
//  - After a transport failure the communicator is broken: later calls return
//    FailedPrecondition carrying the first error. Create a new one to retry.
//  - A Communicator is used by one thread at a time.
#ifndef CKPT_EXCHANGE_COMMUNICATOR_H_
#define CKPT_EXCHANGE_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt {

// Where a communicator's buffers live.
enum class MemoryKind { kHost, kDevice };

absl::string_view MemoryKindName(MemoryKind kind);

// A byte range [offset, offset + length) of a buffer (used by IndexedAllToAllV).
struct ByteSlice {
  size_t offset = 0;
  size_t length = 0;
};

// One peer's message in AllToAllVBuffers: `bytes` bytes at `data`.
struct SendBuffer {
  const void* data = nullptr;
  size_t bytes = 0;
};
struct RecvBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// See the file comment for the conventions every method follows.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  // "gloo", "nccl", ...
  virtual absl::string_view backend_name() const = 0;

  // Root's `bytes` bytes at `data` are copied into `data` on every rank.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root, absl::Time deadline) = 0;

  // Rank r contributes counts[r] bytes from `send`; every rank receives all contributions
  // concatenated in rank order into `recv` (sum(counts) bytes). counts is identical on every
  // rank. `send` may be null when counts[rank()] == 0.
  virtual absl::Status AllGatherV(const void* send, absl::Span<const size_t> counts, void* recv,
                                  absl::Time deadline) = 0;

  // Equal-size all-gather: every rank contributes `bytes`.
  absl::Status AllGather(const void* send, size_t bytes, void* recv, absl::Time deadline);

  // Rank r sends `send_bytes` bytes; root receives them in rank order into `recv`
  // (counts[r] == send_bytes of rank r; counts is used on root only).
  virtual absl::Status GatherV(const void* send, size_t send_bytes, absl::Span<const size_t> counts,
                               void* recv, int root, absl::Time deadline) = 0;

  // Root sends counts[r] bytes (consecutive in `send`, rank order) to rank r, which receives
  // `recv_bytes` (== counts[r]) into `recv`. `send`/`counts` are used on root only.
  virtual absl::Status ScatterV(const void* send, absl::Span<const size_t> counts, void* recv,
                                size_t recv_bytes, int root, absl::Time deadline) = 0;

  // Rank r sends send_counts[p] bytes (consecutive in `send`, peer order) to each peer p and
  // receives recv_counts[p] bytes from p (consecutive in `recv`, peer order). The two sides of
  // each pair must agree on the count.
  virtual absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                                 absl::Span<const size_t> recv_counts, absl::Time deadline) = 0;

  // Indexed all-to-all-v (PhysicsNeMo's indexed_all_to_all_v): for each peer p, the slices
  // send_slices[p] of `send` are sent to p concatenated in order, and the bytes received from
  // p are scattered in order into the slices recv_slices[p] of `recv`. The total lengths of the
  // two sides of each pair must agree; slice boundaries need not.
  virtual absl::Status IndexedAllToAllV(const void* send,
                                        absl::Span<const std::vector<ByteSlice>> send_slices,
                                        void* recv,
                                        absl::Span<const std::vector<ByteSlice>> recv_slices,
                                        absl::Time deadline) = 0;

  // All-to-all-v where each peer's message has its own buffer: sends[p] goes to peer p and
  // recvs[p] is filled from peer p (the two sides of a pair must agree on the size);
  // sends[rank()] is copied into recvs[rank()]. Lets a caller send from and receive into
  // memory in place (no packing) where its data already lies contiguously. This default packs
  // into one AllToAllV and unpacks; backends that can move each buffer in place override it.
  virtual absl::Status AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                        absl::Span<const RecvBuffer> recvs, absl::Time deadline);

  // Point-to-point; a Send matches the Recv with the same (peer, tag) posted in the same order.
  virtual absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                            absl::Time deadline) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                            absl::Time deadline) = 0;

  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier(absl::Time deadline) = 0;
};

// Argument checks shared by backends; return InvalidArgument naming the operation.
absl::Status CheckRank(absl::string_view op, absl::string_view what, int rank, int size);
absl::Status CheckCounts(absl::string_view op, absl::string_view what,
                         absl::Span<const size_t> counts, int size);
absl::Status CheckSlices(absl::string_view op, absl::string_view what,
                         absl::Span<const std::vector<ByteSlice>> slices, int size);

// Sum of counts; total length of slices.
size_t TotalBytes(absl::Span<const size_t> counts);
size_t TotalBytes(absl::Span<const ByteSlice> slices);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_COMMUNICATOR_H_
