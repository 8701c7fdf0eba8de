// Exchange algorithms (seed: Megatron-core dist_checkpointing exchange_utils): after each rank
// has read the shards the load plan's distribution assigned to it, move bytes between ranks so
// that every rank ends up with every shard (or region) it needs. Written only against the
// Communicator interface, on host buffers.
//
// Algorithms, chosen by name in ExchangeByDistribution:
//  - "broadcast" (default): one broadcast per shard needed by 2+ ranks, in distribution order;
//    a shard needed by one rank only is skipped after checking that rank loaded it. Small
//    shards are coalesced per source rank into one broadcast (same output as per-shard).
//  - "gather_rounds": per dtype (dtypes sorted by name), round k is an uneven all-gather of each
//    rank's k-th assigned shard (empty when a rank has none).
//  - "gather_object": an all-gather of each rank's whole map of loaded shards (debugging aid);
//    a shard id loaded by two ranks is an error.
//  - "overlap_all_to_all" (ours): each rank receives only the sub-regions of stored shards that
//    overlap the regions it needs (indexed all-to-all-v over the sharding algebra's overlap
//    runs), so bytes on the wire equal the lower bound. Needed regions may differ from stored
//    ones (resharding); for the other three they must be stored shard ids.
// All four keep receive/staging buffers within ExchangeOptions::memory_budget_bytes per rank,
// splitting the work into waves, and report bytes and time per wave.
//
// Each algorithm comes in two forms: `...Into` writes every needed shard straight into memory
// the caller provides (DestinationBuffers, e.g. a trainer's shared-memory tensors), and the
// allocating form returns fresh ShardBuffers (a thin wrapper over the Into form).
#ifndef CKPT_EXCHANGE_EXCHANGE_H_
#define CKPT_EXCHANGE_EXCHANGE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "exchange/communicator.h"
#include "exchange/staging_arena.h"
#include "sharding/dtype.h"
#include "sharding/piece_id.h"
#include "sharding/region.h"

namespace ckpt {

// What every rank knows about one piece: identity, element type, tensor shape and region.
// Its bytes are the storage-convention flattening of `region` (see sharding/overlap.h).
struct PieceSpec {
  PieceId id;
  DType dtype = DType::kU8;
  std::vector<int64_t> global_shape;
  Region region;

  int64_t NumBytes() const { return region.NumElements() * DTypeSize(dtype); }
};

// A stored shard in the distribution and the rank that loaded it (its main rank).
struct DistributedPiece {
  PieceSpec spec;
  int main_rank = 0;
};

// The part of the load plan the exchange needs; identical on every rank, unless own_share.
struct ExchangePlan {
  int num_ranks = 0;
  // Stored shards in distribution order.
  std::vector<DistributedPiece> distribution;
  // needs[r]: what rank r must end up with.
  std::vector<std::vector<PieceSpec>> needs;
  // overlap_all_to_all only: this rank's own share of the plan, not the whole: the stored
  // shards it loaded or needs, and other ranks' needs only those fed by shards it loaded, each
  // covered by one of them (each list a subsequence of the whole plan's, in its order; the
  // worker's plans are: worker/load_wave_plan.h). The remote transfers are then packed
  // into sub-waves pair by pair (each pair within budget / the larger of its two ranks' peer
  // counts, which one all-gather tells) instead of greedily over every rank's transfers, and a
  // second all-gather agrees on their number.
  bool own_share = false;
};

// Shard bytes keyed by shard id.
using ShardBuffers = std::map<PieceId, std::string, PieceIdLess>;

// Caller-owned memory for each shard a rank needs, keyed by id: exactly one entry per
// PieceSpec in plan.needs[rank], each exactly spec.NumBytes() long, no two overlapping. The
// exchange writes every byte of each (the memory need not be initialized). A destination may
// be the very buffer `loaded` holds under the same shard id, but no other loaded buffer.
using DestinationBuffers = std::map<PieceId, absl::Span<char>, PieceIdLess>;

// Views of `buffers` as destinations (the map must outlive the views).
DestinationBuffers DestinationsOf(ShardBuffers& buffers);

// Tuning and limits.
struct ExchangeOptions {
  // Upper bound on this rank's receive + staging buffers at any time (outputs excluded).
  int64_t memory_budget_bytes = int64_t{1} << 30;
  // broadcast: shards up to this size are coalesced per source rank into one collective.
  int64_t coalesce_max_shard_bytes = int64_t{1} << 20;
  // broadcast: largest coalesced buffer (also capped by the budget).
  int64_t coalesce_max_batch_bytes = int64_t{16} << 20;
  // Every collective of the exchange must finish by this time.
  absl::Time deadline = absl::InfiniteFuture();
  // Optional caller-owned staging memory, reused across exchanges so its pages stay mapped
  // (one exchange at a time per arena). Null: each exchange maps and frees its own.
  StagingArena* staging = nullptr;
};

// One wave: work whose staging fits the budget.
struct WaveStats {
  int64_t bytes_sent = 0;      // bytes this rank put on the wire
  int64_t bytes_received = 0;  // bytes this rank took off the wire
  int64_t collectives = 0;
  absl::Duration time;
};

// What an exchange did on this rank.
struct ExchangeReport {
  std::string algorithm;
  std::vector<WaveStats> waves;
  int64_t bytes_sent() const;
  int64_t bytes_received() const;
  int64_t collectives() const;
};

// Names accepted by ExchangeByDistribution, default first.
const std::vector<std::string>& ExchangeAlgorithmNames();

// Runs the named algorithm on this rank. `loaded` holds exactly the shards the distribution
// assigns to comm.rank(). Returns, keyed by id, every PieceSpec in plan.needs[comm.rank()].
// InvalidArgument for an unknown name (listing the valid ones) or an inconsistent plan;
// FailedPrecondition for a communicator whose memory kind is not host.
// `report` may be null.
absl::StatusOr<ShardBuffers> ExchangeByDistribution(absl::string_view algorithm, Communicator& comm,
                                                    const ExchangePlan& plan,
                                                    const ShardBuffers& loaded,
                                                    const ExchangeOptions& options,
                                                    ExchangeReport* report = nullptr);

// As ExchangeByDistribution, but writes every shard rank comm.rank() needs into
// `destinations` (see DestinationBuffers). InvalidArgument, naming the shard and the rank, for
// a missing, extra, wrong-size or overlapping destination; it is checked before any collective
// starts, so the other ranks then fail at their deadlines naming this rank.
absl::Status ExchangeByDistributionInto(absl::string_view algorithm, Communicator& comm,
                                        const ExchangePlan& plan, const ShardBuffers& loaded,
                                        const DestinationBuffers& destinations,
                                        const ExchangeOptions& options,
                                        ExchangeReport* report = nullptr);

// The algorithms, also callable directly.
absl::StatusOr<ShardBuffers> ExchangeBroadcast(Communicator& comm, const ExchangePlan& plan,
                                               const ShardBuffers& loaded,
                                               const ExchangeOptions& options,
                                               ExchangeReport* report);
absl::StatusOr<ShardBuffers> ExchangeGatherRounds(Communicator& comm, const ExchangePlan& plan,
                                                  const ShardBuffers& loaded,
                                                  const ExchangeOptions& options,
                                                  ExchangeReport* report);
absl::StatusOr<ShardBuffers> ExchangeGatherObject(Communicator& comm, const ExchangePlan& plan,
                                                  const ShardBuffers& loaded,
                                                  const ExchangeOptions& options,
                                                  ExchangeReport* report);
absl::StatusOr<ShardBuffers> ExchangeOverlapAllToAll(Communicator& comm, const ExchangePlan& plan,
                                                     const ShardBuffers& loaded,
                                                     const ExchangeOptions& options,
                                                     ExchangeReport* report);

absl::Status ExchangeBroadcastInto(Communicator& comm, const ExchangePlan& plan,
                                   const ShardBuffers& loaded,
                                   const DestinationBuffers& destinations,
                                   const ExchangeOptions& options, ExchangeReport* report);
absl::Status ExchangeGatherRoundsInto(Communicator& comm, const ExchangePlan& plan,
                                      const ShardBuffers& loaded,
                                      const DestinationBuffers& destinations,
                                      const ExchangeOptions& options, ExchangeReport* report);
absl::Status ExchangeGatherObjectInto(Communicator& comm, const ExchangePlan& plan,
                                      const ShardBuffers& loaded,
                                      const DestinationBuffers& destinations,
                                      const ExchangeOptions& options, ExchangeReport* report);
absl::Status ExchangeOverlapAllToAllInto(Communicator& comm, const ExchangePlan& plan,
                                         const ShardBuffers& loaded,
                                         const DestinationBuffers& destinations,
                                         const ExchangeOptions& options, ExchangeReport* report);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_EXCHANGE_H_
