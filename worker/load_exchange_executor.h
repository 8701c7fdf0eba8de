// Executes a worker's part of an exchange-based load (coordinator/load_exchange.h): joins the
// operation's host-memory communicator (Gloo over TCP, rendezvous through the coordinator's
// Rendezvous KV service under the operation's group prefix), and for each wave of the plan
// reads the units assigned to this rank from storage (checksums verified), runs the exchange
// algorithm, and scatters what this rank needs into the trainer's shared-memory tensors.
// Every stored byte is read from storage by one rank only.
#ifndef CKPT_WORKER_LOAD_EXCHANGE_EXECUTOR_H_
#define CKPT_WORKER_LOAD_EXCHANGE_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport_security.h"
#include "exchange/communicator_cache.h"
#include "exchange/staging_arena.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_gate.h"
#include "worker/memory_registry.h"
#include "worker/memory_tier.h"
#include "worker/staging_pipeline.h"

namespace ckpt::worker {

// Where the communicator meets and how long its steps may take.
struct ExchangeLoadContext {
  std::string rendezvous_address;         // the coordinator's host:port (Rendezvous service)
  TransportSecurity rendezvous_security;  // as the worker's link to the coordinator
  std::string hostname = "127.0.0.1";     // this worker's data-plane address (Gloo binds here)
  int gloo_loop_thread_nice = 10;         // see GlooOptions::loop_thread_nice
  int cuda_device = -1;  // the GPU this worker serves (NCCL, when the plan says device_exchange)
  absl::Duration rendezvous_timeout = absl::Minutes(2);
  absl::Duration exchange_timeout = absl::Minutes(30);  // the whole exchange
  // The worker's memory tier: units of a memory checkpoint (part.memory_manifest() set) are
  // read from it instead of storage (null: such a part fails naming the checkpoint).
  const MemoryTier* memory_tier = nullptr;
  // Where the part's exchange staging and receive buffers come from, kept across operations so
  // that their pages are faulted in once per worker rather than once per operation (null: the
  // worker's process-wide pool, SharedExchangeBuffers()).
  StagingArenaPool* buffers = nullptr;
  // Where the buffers the part reads its units into come from (kept across waves and
  // operations; null: the worker's SharedShardBuffers()).
  ShardBufferPool* read_buffers = nullptr;
  // Where the part's Gloo communicator is kept after the operation succeeded, for the next
  // operation of the same ranks to reuse when all of them still hold it
  // (worker/load_communicator.h: JoinOrReuseLoadCommunicator). Null: the worker's
  // SharedCommunicators() (itself null when the worker keeps none).
  CommunicatorCache* communicators = nullptr;
};

// The worker's pool of exchange buffers (staging and receive arenas of exchange loads, transfer
// receives and serving parts); it keeps up to kSharedExchangeBufferBytes of idle blocks.
inline constexpr int64_t kSharedExchangeBufferBytes = int64_t{1} << 30;
StagingArenaPool& SharedExchangeBuffers();
// The worker's pool of the buffers exchange parts read their units into before sending them;
// it keeps up to kSharedShardBufferBytes of idle capacity.
inline constexpr int64_t kSharedShardBufferBytes = int64_t{512} << 20;
ShardBufferPool& SharedShardBuffers();

// What the part did on this rank.
struct ExchangeLoadStats {
  int64_t bytes_read = 0;       // from storage
  int64_t bytes_sent = 0;       // over the communicator
  int64_t bytes_received = 0;   // over the communicator
  int64_t bytes_scattered = 0;  // into the trainer's tensors
  // Wall time of each step, summed over waves (rendezvous: joining the communicator, or
  // agreeing to reuse the one kept from an earlier operation).
  absl::Duration rendezvous_time, read_time, exchange_time, scatter_time;
  bool communicator_reused = false;  // every rank reused the communicator of an earlier operation
};

// Runs `part` (part.algorithm() is an exchange algorithm name) for the session's rank. A part
// from storage with a manifest_share opens only that share of the checkpoint
// (CheckpointReader::OpenShare: only the data files of the pieces this rank reads are checked;
// its units index the share, ManifestShare.unread_pieces); a hostile share is DataLoss naming
// the rank. Every
// rank of the operation must run its part at the same time. Errors name the rank, job, wave
// and cause (a peer that died mid-exchange shows up as the communicator's error); on error the
// trainer's tensors may hold part of the data and must not be treated as loaded.
// Every write into the trainer's tensors goes through `gate` in chunks; once it closed (the
// operation was aborted) the part stops with its reason: between waves, between chunks of a
// scatter, and while it waits at the rendezvous for peers that will never come.
// The communicator is Gloo over TCP, or NCCL on `context.cuda_device` when the coordinator
// chose the device exchange (part.device_exchange(): every rank device-resident, NCCL on
// every worker; worker/load_communicator.h). Either way the exchange algorithms move host
// buffers (NCCL's collectives stage through the device), and device tensors of this rank
// (mixed states included) get their pieces scattered into a host buffer per tensor, copied
// onto the device through the worker's pinned pool `staging` after the last wave
// (FailedPrecondition without a pool).
absl::Status ExecuteExchangeLoadPart(
    const pb::LoadPlanPart& part, const SessionInfo& session, const ExchangeLoadContext& context,
    MemoryGate& gate, ExchangeLoadStats* stats,
    const std::function<void(int64_t bytes_done)>& progress = nullptr,
    PinnedStagingPool* staging = nullptr);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_EXCHANGE_EXECUTOR_H_
