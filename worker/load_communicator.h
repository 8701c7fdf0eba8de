// The communicator of one exchange-based load part, created per operation group through the
// coordinator's rendezvous: Gloo over TCP from host staging, or NCCL on the device when the
// coordinator chose the device exchange (pb::LoadPlanPart::device_exchange, decided by
// coordinator/load_exchange's ChooseExchangeTransport). The exchange algorithms stay written
// against `Communicator` only: the NCCL communicator is presented to them as a host one
// (exchange/nccl/host_staging_communicator.h), so their buffers stay in host memory and each
// collective stages through the device.
#ifndef CKPT_WORKER_LOAD_COMMUNICATOR_H_
#define CKPT_WORKER_LOAD_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "exchange/communicator_cache.h"
#include "exchange/communicator_factory.h"
#include "proto/coordinator.pb.h"
#include "rendezvous/store.h"

namespace ckpt::worker {

// What the worker brings to a load's communicator.
struct LoadCommunicatorConfig {
  std::string hostname = "127.0.0.1";  // Gloo binds here
  int gloo_loop_thread_nice = 10;
  int cuda_device = -1;            // the GPU this worker serves (-1: none)
  std::string rendezvous_address;  // for messages
  absl::Duration rendezvous_timeout = absl::Minutes(2);
};

// The factory options for `part`: host memory (Gloo) unless part.device_exchange(), then
// device memory (NCCL) on config.cuda_device. The group is part.group(). FailedPrecondition
// naming `who` when the plan asks for the device exchange of a worker that serves no GPU (the
// coordinator and the worker disagree about it).
absl::StatusOr<CommunicatorOptions> LoadCommunicatorOptions(const pb::LoadPlanPart& part,
                                                            const LoadCommunicatorConfig& config,
                                                            const std::string& who);

// Joins `part`'s group through `store` with LoadCommunicatorOptions, on the calling thread
// (which then uses the communicator: NCCL's device is made current on it). Returns a
// host-memory communicator either way. Errors name `who`, the group, the world, the transport
// and the rendezvous address.
absl::StatusOr<std::unique_ptr<Communicator>> JoinLoadCommunicator(
    const pb::LoadPlanPart& part, const LoadCommunicatorConfig& config, Store* store,
    const std::string& who);

// This rank's number in `part`'s communicator: its group rank when the load runs in several
// process groups (LoadPlanPart.group_ranks set), else its rank.
int CommunicatorRank(const pb::LoadPlanPart& part);

// "nccl (device)" or "gloo (host staging)", for logs.
std::string LoadTransportName(const pb::LoadPlanPart& part);

// The worker's communicators kept between operations (exchange/communicator_cache.h): one per
// rank of each group shape it served recently, kSharedCommunicatorCacheEntries at most unless
// SetSharedCommunicatorCacheEntries said otherwise (each holds a Gloo TCP device: one
// event-loop thread and a socket per peer). Null when set to 0: every operation joins anew, as
// before issue 40 (no reuse round either).
inline constexpr size_t kSharedCommunicatorCacheEntries = 16;
CommunicatorCache* SharedCommunicators();
// Sizes the shared cache (worker flag --communicator_cache_entries); call before its first use.
void SetSharedCommunicatorCacheEntries(size_t entries);

// The cache entry of `part`'s rank: the group's kind (the prefix of part.group(): "load",
// "save"), the process-group index, the world size, this rank's number in it and the data-plane
// address. Only a hint (ranks of other jobs may share it): whether an entry is reused is agreed
// by all ranks of the group, whose tokens match only when every one of them holds its side of
// the same communicator.
std::string CommunicatorCacheKey(const pb::LoadPlanPart& part,
                                 const LoadCommunicatorConfig& config);

// A part's communicator, reused from a cache or joined anew. Finish(OK) after the operation
// succeeded on this rank puts it back into the cache for the next operation of the same ranks;
// anything else (an error, or destruction without Finish) drops it.
class PartCommunicator {
 public:
  PartCommunicator(std::unique_ptr<Communicator> communicator, CachedCommunicator* cached,
                   CommunicatorCache* cache, std::string key, bool reused)
      : communicator_(std::move(communicator)),
        cached_(cached),
        cache_(cache),
        key_(std::move(key)),
        reused_(reused) {}
  PartCommunicator(PartCommunicator&&) = default;
  PartCommunicator& operator=(PartCommunicator&&) = default;

  Communicator& get() { return *communicator_; }
  // Whether every rank agreed to reuse the communicator of an earlier operation.
  bool reused() const { return reused_; }
  void Finish(const absl::Status& outcome);

 private:
  std::unique_ptr<Communicator> communicator_;
  CachedCommunicator* cached_ = nullptr;  // communicator_ when it may be cached
  CommunicatorCache* cache_ = nullptr;
  std::string key_;
  bool reused_ = false;
};

// JoinLoadCommunicator through `cache` (null: no reuse, the plain join). A host (Gloo) part's
// rank takes its entry under `key` from the cache and announces it in the group's store
// ("reuse/<rank>": the entry's CachedCommunicator::ReuseToken(), or "-" for none); when every
// rank of the group announced the same token, they all reuse it (no mesh rendezvous, no TCP
// connects). Otherwise every rank drops its entry and joins anew (the new communicator's
// instance is part.group()). A rank that announces "-" does not wait for the others' tokens:
// it cannot match. Waiting for the tokens is bounded by config.rendezvous_timeout and names the
// ranks that never announced. Device (NCCL) parts are never cached.
absl::StatusOr<PartCommunicator> JoinOrReuseLoadCommunicator(const pb::LoadPlanPart& part,
                                                             const LoadCommunicatorConfig& config,
                                                             Store* store, const std::string& who,
                                                             CommunicatorCache* cache,
                                                             const std::string& key);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_COMMUNICATOR_H_
