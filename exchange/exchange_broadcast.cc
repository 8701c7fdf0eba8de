// The "broadcast" exchange (Megatron's default) with small shards coalesced per source rank.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "exchange/exchange.h"
#include "exchange/exchange_internal.h"

namespace ckpt {
namespace {

using exchange_internal::WaveRecorder;

// State of one rank's run of the algorithm.
class BroadcastExchange {
 public:
  BroadcastExchange(Communicator& comm, const ExchangePlan& plan, const ShardBuffers& loaded,
                    const ExchangeOptions& options, std::vector<std::vector<int>> holders,
                    const DestinationBuffers& out)
      : comm_(comm),
        plan_(plan),
        loaded_(loaded),
        options_(options),
        holders_(std::move(holders)),
        out_(out),
        waves_(options.memory_budget_bytes),
        staging_(options.staging != nullptr ? *options.staging : own_staging_) {}

  absl::Status Run() {
    const int64_t batch_limit =
        std::min(options_.coalesce_max_batch_bytes, options_.memory_budget_bytes);
    for (int i = 0; i < static_cast<int>(plan_.distribution.size()); ++i) {
      const DistributedPiece& d = plan_.distribution[i];
      const std::vector<int>& h = holders_[i];
      if (h.empty()) continue;
      if (h.size() == 1) {
        if (h[0] != d.main_rank) {
          return absl::FailedPreconditionError(absl::StrCat(
              "broadcast exchange: shard ", d.spec.id.DebugString(), " is needed only by rank ",
              h[0], " but the distribution assigned it to rank ", d.main_rank));
        }
        continue;
      }
      const int64_t bytes = d.spec.NumBytes();
      if (bytes <= options_.coalesce_max_shard_bytes && bytes <= batch_limit) {
        std::vector<int>& batch = pending_[d.main_rank];
        int64_t& batch_bytes = pending_bytes_[d.main_rank];
        if (batch_bytes + bytes > batch_limit) {
          CKPT_RETURN_IF_ERROR(FlushBatch(d.main_rank));
        }
        batch.push_back(i);
        batch_bytes += bytes;
      } else {
        CKPT_RETURN_IF_ERROR(BroadcastLarge(i));
      }
    }
    for (int root = 0; root < comm_.size(); ++root) {
      CKPT_RETURN_IF_ERROR(FlushBatch(root));
    }
    return absl::OkStatus();
  }

  void Finish(ExchangeReport* report) { waves_.Finish("broadcast", report); }

 private:
  bool Needs(int shard) const {
    const std::vector<int>& h = holders_[shard];
    return std::binary_search(h.begin(), h.end(), comm_.rank());
  }

  absl::Status Broadcast(char* data, size_t bytes, int root, int64_t staging) {
    absl::Time start = absl::Now();
    CKPT_RETURN_IF_ERROR(comm_.Broadcast(data, bytes, root, options_.deadline));
    const bool is_root = comm_.rank() == root;
    waves_.Add(staging, is_root ? static_cast<int64_t>(bytes) * (comm_.size() - 1) : 0,
               is_root ? 0 : bytes, absl::Now() - start);
    return absl::OkStatus();
  }

  // One shard, in windows of at most the budget. Ranks that need it receive straight into
  // their output; the others into a discard window.
  absl::Status BroadcastLarge(int i) {
    const DistributedPiece& d = plan_.distribution[i];
    const size_t bytes = d.spec.NumBytes();
    const size_t window = std::max<int64_t>(1, options_.memory_budget_bytes);
    const bool is_root = comm_.rank() == d.main_rank;
    char* target = nullptr;
    char* discard = nullptr;
    if (is_root) {
      target = const_cast<char*>(loaded_.at(d.spec.id).data());
    } else if (Needs(i)) {
      target = out_.at(d.spec.id).data();
    } else {
      CKPT_ASSIGN_OR_RETURN(discard, staging_.Reserve(std::min(bytes, window)));
    }
    for (size_t at = 0; at < bytes; at += window) {
      size_t n = std::min(window, bytes - at);
      char* dst = target != nullptr ? target + at : discard;
      CKPT_RETURN_IF_ERROR(
          Broadcast(dst, n, d.main_rank, target != nullptr ? 0 : static_cast<int64_t>(n)));
    }
    return absl::OkStatus();
  }

  // All pending small shards of `root` in one coalesced broadcast.
  absl::Status FlushBatch(int root) {
    std::vector<int>& batch = pending_[root];
    if (batch.empty()) return absl::OkStatus();
    const size_t total = pending_bytes_[root];
    CKPT_ASSIGN_OR_RETURN(char* buffer, staging_.Reserve(total));
    const bool is_root = comm_.rank() == root;
    if (is_root) {
      size_t at = 0;
      for (int i : batch) {
        const std::string& src = loaded_.at(plan_.distribution[i].spec.id);
        if (!src.empty()) std::memcpy(buffer + at, src.data(), src.size());
        at += src.size();
      }
    }
    CKPT_RETURN_IF_ERROR(Broadcast(buffer, total, root, static_cast<int64_t>(total)));
    if (!is_root) {
      size_t at = 0;
      for (int i : batch) {
        const PieceSpec& spec = plan_.distribution[i].spec;
        const size_t n = spec.NumBytes();
        if (Needs(i) && n > 0) std::memcpy(out_.at(spec.id).data(), buffer + at, n);
        at += n;
      }
    }
    batch.clear();
    pending_bytes_[root] = 0;
    return absl::OkStatus();
  }

  Communicator& comm_;
  const ExchangePlan& plan_;
  const ShardBuffers& loaded_;
  const ExchangeOptions& options_;
  const std::vector<std::vector<int>> holders_;
  const DestinationBuffers& out_;
  WaveRecorder waves_;
  StagingArena own_staging_;
  StagingArena& staging_;
  std::map<int, std::vector<int>> pending_;
  std::map<int, int64_t> pending_bytes_;
};

}  // namespace

absl::Status ExchangeBroadcastInto(Communicator& comm, const ExchangePlan& plan,
                                   const ShardBuffers& loaded,
                                   const DestinationBuffers& destinations,
                                   const ExchangeOptions& options, ExchangeReport* report) {
  using namespace exchange_internal;
  CKPT_ASSIGN_OR_RETURN(DistributionIndex index, IndexPlan(plan, comm));
  CKPT_RETURN_IF_ERROR(CheckLoaded(plan, index, comm.rank(), loaded));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::vector<int>> holders, HoldersOfStoredShards(plan, index));
  CKPT_RETURN_IF_ERROR(CheckDestinations(plan, comm.rank(), loaded, destinations).status());
  // Shards this rank loaded itself.
  for (const auto& [id, target] : destinations) {
    auto it = loaded.find(id);
    if (it != loaded.end()) CopyLoaded(it->second, target);
  }
  BroadcastExchange exchange(comm, plan, loaded, options, std::move(holders), destinations);
  CKPT_RETURN_IF_ERROR(exchange.Run());
  exchange.Finish(report);
  return absl::OkStatus();
}

absl::StatusOr<ShardBuffers> ExchangeBroadcast(Communicator& comm, const ExchangePlan& plan,
                                               const ShardBuffers& loaded,
                                               const ExchangeOptions& options,
                                               ExchangeReport* report) {
  return exchange_internal::RunAllocating(ExchangeBroadcastInto, comm, plan, loaded, options,
                                          report);
}

}  // namespace ckpt
