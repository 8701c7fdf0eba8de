#include "worker/load_communicator.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "exchange/nccl/host_staging_communicator.h"

namespace ckpt::worker {

absl::StatusOr<CommunicatorOptions> LoadCommunicatorOptions(const pb::LoadPlanPart& part,
                                                            const LoadCommunicatorConfig& config,
                                                            const std::string& who) {
  CommunicatorOptions options;
  options.group_name = part.group();
  options.hostname = config.hostname;
  options.gloo_loop_thread_nice = config.gloo_loop_thread_nice;
  if (!part.device_exchange()) {
    options.memory_kind = MemoryKind::kHost;
    return options;
  }
  if (config.cuda_device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the plan asks for the device exchange over NCCL (",
                     part.transport_reason(), ") but this worker serves no GPU"));
  }
  options.memory_kind = MemoryKind::kDevice;
  options.cuda_device = config.cuda_device;
  return options;
}

int CommunicatorRank(const pb::LoadPlanPart& part) {
  return part.group_ranks_size() > 0 ? part.group_rank() : part.rank();
}

std::string LoadTransportName(const pb::LoadPlanPart& part) {
  return part.device_exchange() ? "nccl (device)" : "gloo (host staging)";
}

absl::StatusOr<std::unique_ptr<Communicator>> JoinLoadCommunicator(
    const pb::LoadPlanPart& part, const LoadCommunicatorConfig& config, Store* store,
    const std::string& who) {
  absl::StatusOr<CommunicatorOptions> options = LoadCommunicatorOptions(part, config, who);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(store, CommunicatorRank(part), part.world_size(), *options,
                         absl::Now() + config.rendezvous_timeout);
  if (!comm.ok()) {
    return absl::Status(
        comm.status().code(),
        absl::StrCat(who, ": joining the load's communicator (", LoadTransportName(part),
                     ", group ", part.group(), ", ", part.world_size(), " ranks, rendezvous at ",
                     config.rendezvous_address, "): ", comm.status().message()));
  }
  if ((*comm)->memory_kind() == MemoryKind::kHost) return comm;
  // The exchange algorithms move host buffers: each collective goes through the device.
  return std::unique_ptr<Communicator>(std::make_unique<HostStagingCommunicator>(*std::move(comm)));
}

namespace {
std::atomic<size_t> shared_cache_entries{kSharedCommunicatorCacheEntries};
}  // namespace

void SetSharedCommunicatorCacheEntries(size_t entries) { shared_cache_entries = entries; }

CommunicatorCache* SharedCommunicators() {
  static CommunicatorCache* cache =
      shared_cache_entries > 0 ? new CommunicatorCache(shared_cache_entries) : nullptr;
  return cache;
}

std::string CommunicatorCacheKey(const pb::LoadPlanPart& part,
                                 const LoadCommunicatorConfig& config) {
  const std::string& group = part.group();
  const std::string kind = group.substr(0, group.find('/'));
  return absl::StrCat(kind, "|g", part.group_index(), "|", part.world_size(), "|r",
                      CommunicatorRank(part), "|", config.hostname);
}

void PartCommunicator::Finish(const absl::Status& outcome) {
  if (cache_ == nullptr || cached_ == nullptr || communicator_ == nullptr) return;
  if (!outcome.ok()) {
    communicator_.reset();  // dropped: it may be out of step with its peers
    return;
  }
  communicator_.release();  // owned by cached_'s unique_ptr below
  cache_->Put(key_, std::unique_ptr<CachedCommunicator>(cached_));
  cached_ = nullptr;
}

namespace {

constexpr absl::string_view kNothingToReuse = "-";

// Announces `mine` as rank `me`'s reuse token and, unless it is kNothingToReuse, waits for every
// rank's; true when all announced `mine`.
absl::StatusOr<bool> AgreeOnReuse(Store& group_store, int me, int world, const std::string& mine,
                                  absl::Time deadline, const std::string& where) {
  absl::Status set = group_store.Set(absl::StrCat("reuse/", me), mine, deadline);
  if (!set.ok()) return absl::Status(set.code(), absl::StrCat(where, ": ", set.message()));
  if (mine == kNothingToReuse) return false;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat("reuse/", r));
  absl::StatusOr<std::vector<std::string>> tokens = group_store.Get(keys, deadline);
  if (tokens.ok()) {
    for (const std::string& token : *tokens) {
      if (token != mine) return false;
    }
    return true;
  }
  if (tokens.status().code() != absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(tokens.status().code(),
                        absl::StrCat(where, ": ", tokens.status().message()));
  }
  return NeverArrivedError(group_store, keys, where);
}

}  // namespace

absl::StatusOr<PartCommunicator> JoinOrReuseLoadCommunicator(const pb::LoadPlanPart& part,
                                                             const LoadCommunicatorConfig& config,
                                                             Store* store, const std::string& who,
                                                             CommunicatorCache* cache,
                                                             const std::string& key) {
  if (cache == nullptr || part.device_exchange()) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        JoinLoadCommunicator(part, config, store, who);
    if (!comm.ok()) return comm.status();
    return PartCommunicator(*std::move(comm), nullptr, nullptr, "", false);
  }
  const absl::Time deadline = absl::Now() + config.rendezvous_timeout;
  std::unique_ptr<CachedCommunicator> held = cache->Take(key);
  const std::string mine = held != nullptr ? held->ReuseToken() : std::string(kNothingToReuse);
  PrefixedStore group_store(part.group(), store);
  absl::StatusOr<bool> agreed = AgreeOnReuse(
      group_store, CommunicatorRank(part), part.world_size(), mine, deadline,
      absl::StrCat(who, ": agreeing on the reuse of the communicator of group ", part.group(), " (",
                   part.world_size(), " ranks, rendezvous at ", config.rendezvous_address, ")"));
  if (!agreed.ok()) return agreed.status();  // `held` is dropped: its peers may have moved on
  if (*agreed) {
    CachedCommunicator* cached = held.get();
    return PartCommunicator(std::move(held), cached, cache, key, true);
  }
  held.reset();  // every rank drops its entry and joins anew
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      JoinLoadCommunicator(part, config, store, who);
  if (!comm.ok()) return comm.status();
  auto cached = std::make_unique<CachedCommunicator>(*std::move(comm), part.group());
  CachedCommunicator* raw = cached.get();
  return PartCommunicator(std::move(cached), raw, cache, key, false);
}

}  // namespace ckpt::worker
