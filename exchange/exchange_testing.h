// Test and benchmark support for the exchange algorithms: deterministic scenarios (tensors of
// every dtype, stored shards as boxes and flat ranges, needs as stored ids or resharded
// regions), their single-process reference outputs, and a fault-injecting Communicator.
#ifndef CKPT_EXCHANGE_EXCHANGE_TESTING_H_
#define CKPT_EXCHANGE_EXCHANGE_TESTING_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exchange/communicator.h"
#include "exchange/exchange.h"

namespace ckpt {

// Deterministic bytes of `spec`'s region: each element's bytes depend only on the tensor key,
// the element's global index and the byte position, so any two regions agree where they
// overlap. Computed element by element (independent of sharding/overlap.h).
std::string ReferenceRegionBytes(const PieceSpec& spec);

// How a scenario is built.
struct ScenarioOptions {
  int num_ranks = 1;
  uint64_t seed = 1;
  // Multiplies the length of the last dimension of every tensor (payload size).
  int64_t scale = 1;
  // false: every rank needs a subset of the stored shards (ids; some needed by one rank only,
  // always its loader). true: needs are a different layout (column chunks, flat ranges, whole
  // tensors), only valid for overlap_all_to_all.
  bool reshard = false;
};

// A plan plus every rank's loaded shards.
struct Scenario {
  ExchangePlan plan;
  std::vector<ShardBuffers> loaded;
};

// Tensors of every dtype (incl. a 0-element tensor and a 0-d scalar), stored as dim-0 chunks
// (some empty) or flat ranges, spread over ranks in a seed-shuffled distribution order.
Scenario MakeScenario(const ScenarioOptions& options);

// What rank `rank` must end up with.
ShardBuffers ReferenceOutputs(const ExchangePlan& plan, int rank);

// Bytes rank `rank` must receive at least: elements of its needs not stored on itself.
int64_t LowerBoundReceiveBytes(const ExchangePlan& plan, int rank);

// Forwards to `inner`, but the `fail_at`-th call (1-based) runs `on_fault` instead and returns
// its status (e.g. _exit for a dying process, or dropping the inner communicator).
class FaultInjectingCommunicator : public Communicator {
 public:
  FaultInjectingCommunicator(std::unique_ptr<Communicator> inner, int fail_at,
                             std::function<absl::Status(std::unique_ptr<Communicator>&)> on_fault)
      : inner_(std::move(inner)),
        rank_(inner_->rank()),
        size_(inner_->size()),
        fail_at_(fail_at),
        on_fault_(std::move(on_fault)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  absl::string_view backend_name() const override { return "fault-injecting"; }

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
  // True when this call is the faulty one (after running on_fault_).
  bool Fault(absl::Status* status);

  std::unique_ptr<Communicator> inner_;
  int rank_;
  int size_;
  int fail_at_;
  int calls_ = 0;
  std::function<absl::Status(std::unique_ptr<Communicator>&)> on_fault_;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_EXCHANGE_TESTING_H_
