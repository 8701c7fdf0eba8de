// Pieces shared by the exchange algorithms (not a public API): plan validation, wave
// accounting and a budgeted all-gather-v.
#ifndef CKPT_EXCHANGE_EXCHANGE_INTERNAL_H_
#define CKPT_EXCHANGE_EXCHANGE_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "exchange/communicator.h"
#include "exchange/exchange.h"

namespace ckpt {
namespace exchange_internal {

// Checks the plan's rank count and needs list against the group.
absl::Status CheckPlanShape(const ExchangePlan& plan, const Communicator& comm);

// Position of each stored shard in the distribution.
using DistributionIndex = absl::flat_hash_map<PieceId, int>;

// Checks the plan against the group: rank count, main ranks in range, distinct stored ids,
// valid regions. Returns the index of stored shards.
absl::StatusOr<DistributionIndex> IndexPlan(const ExchangePlan& plan, const Communicator& comm);

// Checks that `loaded` holds exactly the stored shards assigned to `rank`, with their sizes.
absl::Status CheckLoaded(const ExchangePlan& plan, const DistributionIndex& index, int rank,
                         const ShardBuffers& loaded);

// For the id-based algorithms: every needed shard must be a stored shard (same size), and no
// rank may list a shard twice. Returns, per stored shard, the ranks needing it (ascending).
absl::StatusOr<std::vector<std::vector<int>>> HoldersOfStoredShards(const ExchangePlan& plan,
                                                                    const DistributionIndex& index);

// Allocates the zero-filled output buffers for `rank`'s needs (duplicates are an error).
absl::StatusOr<ShardBuffers> AllocateOutputs(const ExchangePlan& plan, int rank);

// Checks `destinations` against `rank`'s needs (valid regions, no duplicate needs, one
// destination of the right size per need, no extra ones, no two overlapping, none overlapping
// a loaded buffer other than the one with its own id). Returns them in plan.needs[rank] order.
absl::StatusOr<std::vector<absl::Span<char>>> CheckDestinations(
    const ExchangePlan& plan, int rank, const ShardBuffers& loaded,
    const DestinationBuffers& destinations);

// Copies a loaded shard into its destination (nothing when they are the same memory).
void CopyLoaded(const std::string& loaded, absl::Span<char> destination);

// The allocating form of an algorithm: checks the plan's shape, allocates outputs for
// comm.rank()'s needs and runs `into` on them.
using IntoAlgorithm = absl::Status (*)(Communicator&, const ExchangePlan&, const ShardBuffers&,
                                       const DestinationBuffers&, const ExchangeOptions&,
                                       ExchangeReport*);
absl::StatusOr<ShardBuffers> RunAllocating(IntoAlgorithm into, Communicator& comm,
                                           const ExchangePlan& plan, const ShardBuffers& loaded,
                                           const ExchangeOptions& options, ExchangeReport* report);

// Groups consecutive collectives into waves whose staging stays within the budget, and
// times them.
class WaveRecorder {
 public:
  explicit WaveRecorder(int64_t budget) : budget_(budget) {}
  // Records one collective that used `staging` bytes of temporary memory on this rank.
  void Add(int64_t staging, int64_t sent, int64_t received, absl::Duration time);
  // Starts a new wave explicitly (for algorithms that plan their own waves and may move bytes
  // in place, using less staging than the wave's budget).
  void StartWave();
  // Appends the waves to report (if non-null) with the algorithm name.
  void Finish(absl::string_view algorithm, ExchangeReport* report);

 private:
  int64_t budget_;
  int64_t wave_staging_ = 0;
  std::vector<WaveStats> waves_;
};

// A piece of this rank's contribution to a ChunkedAllGatherV (contributions may be scattered
// over several buffers; they are packed chunk by chunk).
struct Segment {
  const char* data;
  size_t size;
};

// Called with bytes [offset, offset + size) of rank `source`'s contribution.
using ChunkSink = std::function<void(int source, size_t offset, const char* data, size_t size)>;

// An all-gather-v of each rank's contribution (sizes[r] bytes; identical on every rank) done
// in sub-rounds whose send + receive staging (taken from `staging`) fits `budget`. Each
// sub-round moves the same byte window of every contribution. `sink` also sees this rank's own
// bytes.
absl::Status ChunkedAllGatherV(Communicator& comm, absl::Span<const Segment> mine,
                               absl::Span<const size_t> sizes, int64_t budget, absl::Time deadline,
                               WaveRecorder& waves, StagingArena& staging, const ChunkSink& sink);

// Copies `size` bytes at logical offset `offset` of the concatenation of `segments` into dst.
void ReadSegments(absl::Span<const Segment> segments, size_t offset, size_t size, char* dst);

}  // namespace exchange_internal
}  // namespace ckpt

#endif  // CKPT_EXCHANGE_EXCHANGE_INTERNAL_H_
