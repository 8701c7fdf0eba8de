// Communicators kept across operations (issue 40 item 5). Joining a Gloo group costs a
// rendezvous through the coordinator (arrival, the address exchange of connectFullMesh, N-1 TCP
// connects, a closing barrier): 0.15-0.3 s of a live-transfer receive on the 2-core machine.
// A worker keeps the communicator of each of its ranks after an operation that succeeded, and
// the next operation of the same ranks reuses it when every rank of the group still holds the
// very same one (worker/load_communicator.h decides that with one store round, so a rank whose
// worker restarted, or whose copy was dropped, makes every rank build a new one).
//
// CachedCommunicator wraps a communicator with what that agreement needs: the instance it
// belongs to (the group name it was built under, the same on every rank), how many calls it
// has served (equal on every rank of a group that ran the same collectives: a communicator
// whose ranks disagree is never reused, so their message slots cannot drift apart), and
// whether any call failed (a failed communicator is broken and is never put back).
#ifndef CKPT_EXCHANGE_COMMUNICATOR_CACHE_H_
#define CKPT_EXCHANGE_COMMUNICATOR_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "exchange/communicator.h"

namespace ckpt {

// A communicator with its instance name, call count and failure flag (see the file comment).
// Forwards every call; used by one thread at a time, like any Communicator.
class CachedCommunicator final : public Communicator {
 public:
  CachedCommunicator(std::unique_ptr<Communicator> inner, std::string instance)
      : inner_(std::move(inner)), instance_(std::move(instance)) {}

  // The group name the communicator was built under (identical on all its ranks).
  const std::string& instance() const { return instance_; }
  // Calls served so far (every method below except the accessors counts one).
  uint64_t calls() const { return calls_; }
  // The first error any call returned (OK while none failed).
  const absl::Status& failure() const { return failure_; }
  // What this rank announces when it offers the communicator for reuse:
  // "<instance>|<size>|<calls>". Ranks reuse only when all announce the same text.
  std::string ReuseToken() const;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  absl::string_view backend_name() const override { return inner_->backend_name(); }

  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Time deadline) override;
  absl::Status AllGatherV(const void* send, absl::Span<const size_t> counts, void* recv,
                          absl::Time deadline) override;
  absl::Status GatherV(const void* send, size_t send_bytes, absl::Span<const size_t> counts,
                       void* recv, int root, absl::Time deadline) override;
  absl::Status ScatterV(const void* send, absl::Span<const size_t> counts, void* recv,
                        size_t recv_bytes, int root, absl::Time deadline) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Time deadline) override;
  absl::Status IndexedAllToAllV(const void* send,
                                absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
                                absl::Span<const std::vector<ByteSlice>> recv_slices,
                                absl::Time deadline) override;
  absl::Status AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                absl::Span<const RecvBuffer> recvs, absl::Time deadline) override;
  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Time deadline) override;
  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag, absl::Time deadline) override;
  absl::Status Barrier(absl::Time deadline) override;

 private:
  absl::Status Track(absl::Status status);

  std::unique_ptr<Communicator> inner_;
  const std::string instance_;
  uint64_t calls_ = 0;
  absl::Status failure_;
};

// What a cache did, for logs and tests.
struct CommunicatorCacheStats {
  int64_t taken = 0;    // Take found an entry
  int64_t missed = 0;   // Take found none
  int64_t kept = 0;     // Put stored one
  int64_t refused = 0;  // Put dropped one that had failed
  int64_t evicted = 0;  // dropped to stay within max_entries, or replaced under its key
};

// A bounded map key -> communicator (least recently stored dropped first). Take removes the
// entry, so a communicator is never used by two operations at once; Put gives it back.
// Thread-safe. Dropping an entry destroys the communicator, which closes its connections: its
// peers then fail fast if they try to use their side, and announce nothing reusable.
class CommunicatorCache {
 public:
  explicit CommunicatorCache(size_t max_entries) : max_entries_(max_entries) {}

  // The entry under `key`, removed from the cache; null when there is none.
  std::unique_ptr<CachedCommunicator> Take(const std::string& key);
  // Stores `communicator` under `key` (replacing what is there) unless one of its calls failed
  // (then it is destroyed, and counted as refused). A cache of max_entries 0 keeps nothing.
  void Put(const std::string& key, std::unique_ptr<CachedCommunicator> communicator);

  size_t size() const;
  CommunicatorCacheStats stats() const;

 private:
  struct Entry {
    std::string key;
    std::unique_ptr<CachedCommunicator> communicator;
  };
  const size_t max_entries_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;  // oldest first
  CommunicatorCacheStats stats_;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_COMMUNICATOR_CACHE_H_
