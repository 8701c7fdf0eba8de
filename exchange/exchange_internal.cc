#include "exchange/exchange_internal.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ckpt {
namespace exchange_internal {

absl::Status CheckPlanShape(const ExchangePlan& plan, const Communicator& comm) {
  if (plan.num_ranks != comm.size()) {
    return absl::InvalidArgumentError(absl::StrCat("exchange plan is for ", plan.num_ranks,
                                                   " ranks but the group has ", comm.size()));
  }
  if (static_cast<int>(plan.needs.size()) != plan.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exchange plan lists needs for ", plan.needs.size(), " ranks, expected ", plan.num_ranks));
  }
  return absl::OkStatus();
}

absl::StatusOr<DistributionIndex> IndexPlan(const ExchangePlan& plan, const Communicator& comm) {
  CKPT_RETURN_IF_ERROR(CheckPlanShape(plan, comm));
  DistributionIndex index;
  index.reserve(plan.distribution.size());
  for (int i = 0; i < static_cast<int>(plan.distribution.size()); ++i) {
    const DistributedPiece& d = plan.distribution[i];
    if (d.main_rank < 0 || d.main_rank >= plan.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", d.spec.id.DebugString(),
                                                     " is assigned to rank ", d.main_rank,
                                                     " outside the group of ", plan.num_ranks));
    }
    absl::Status valid = ValidateRegion(d.spec.region, d.spec.global_shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stored shard ", d.spec.id.DebugString(), ": ", valid.message()));
    }
    if (!index.emplace(d.spec.id, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", d.spec.id.DebugString(), " appears twice in the distribution"));
    }
  }
  return index;
}

absl::Status CheckLoaded(const ExchangePlan& plan, const DistributionIndex& index, int rank,
                         const ShardBuffers& loaded) {
  size_t assigned = 0;
  for (const DistributedPiece& d : plan.distribution) {
    if (d.main_rank != rank) continue;
    ++assigned;
    auto it = loaded.find(d.spec.id);
    if (it == loaded.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " was assigned shard ", d.spec.id.DebugString(), " but did not load it"));
    }
    if (static_cast<int64_t>(it->second.size()) != d.spec.NumBytes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " loaded ", it->second.size(), " bytes for shard ",
                       d.spec.id.DebugString(), " which has ", d.spec.NumBytes()));
    }
  }
  if (loaded.size() != assigned) {
    for (const auto& [id, bytes] : loaded) {
      auto it = index.find(id);
      if (it == index.end()) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " loaded shard ",
                                                          id.DebugString(),
                                                          " which is not in the distribution"));
      }
      if (plan.distribution[it->second].main_rank != rank) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank, " loaded shard ", id.DebugString(),
            " which the distribution assigns to rank ", plan.distribution[it->second].main_rank));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int>>> HoldersOfStoredShards(
    const ExchangePlan& plan, const DistributionIndex& index) {
  std::vector<std::vector<int>> holders(plan.distribution.size());
  for (int r = 0; r < plan.num_ranks; ++r) {
    for (const PieceSpec& need : plan.needs[r]) {
      auto it = index.find(need.id);
      if (it == index.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " needs shard ", need.id.DebugString(),
                         " which no rank stores (only overlap_all_to_all can assemble "
                         "regions that differ from stored shards)"));
      }
      const PieceSpec& stored = plan.distribution[it->second].spec;
      if (stored.NumBytes() != need.NumBytes() || stored.dtype != need.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " needs shard ", need.id.DebugString(), " as ", need.NumBytes(),
            " bytes of ", DTypeName(need.dtype), " but it is stored as ", stored.NumBytes(),
            " bytes of ", DTypeName(stored.dtype)));
      }
      std::vector<int>& h = holders[it->second];
      if (!h.empty() && h.back() == r) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " lists shard ", need.id.DebugString(), " twice"));
      }
      h.push_back(r);
    }
  }
  return holders;
}

namespace {

// Sizes `s` to `bytes` zero bytes. For large sizes the memory is reserved first and its 2 MiB
// aligned interior marked MADV_HUGEPAGE before the zero-fill touches it, so that filling takes
// one page fault per 2 MiB instead of per 4 KiB (a hint; without THP nothing changes).
void ResizeWithHugePageHint(std::string& s, size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes >= 2 * kHugePage) {
    s.reserve(bytes);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(s.data());
    const uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
    const uintptr_t last = (begin + bytes) / kHugePage * kHugePage;
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
  s.resize(bytes);
}

}  // namespace

absl::StatusOr<ShardBuffers> AllocateOutputs(const ExchangePlan& plan, int rank) {
  ShardBuffers out;
  for (const PieceSpec& need : plan.needs[rank]) {
    absl::Status valid = ValidateRegion(need.region, need.global_shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " needs shard ",
                                                     need.id.DebugString(), ": ", valid.message()));
    }
    auto [it, inserted] = out.emplace(need.id, std::string());
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " lists shard ", need.id.DebugString(), " twice"));
    }
    ResizeWithHugePageHint(it->second, need.NumBytes());
  }
  return out;
}

absl::StatusOr<std::vector<absl::Span<char>>> CheckDestinations(
    const ExchangePlan& plan, int rank, const ShardBuffers& loaded,
    const DestinationBuffers& destinations) {
  std::vector<absl::Span<char>> targets;
  targets.reserve(plan.needs[rank].size());
  absl::flat_hash_set<PieceId> seen;
  for (const PieceSpec& need : plan.needs[rank]) {
    absl::Status valid = ValidateRegion(need.region, need.global_shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " needs shard ",
                                                     need.id.DebugString(), ": ", valid.message()));
    }
    if (!seen.insert(need.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " lists shard ", need.id.DebugString(), " twice"));
    }
    auto it = destinations.find(need.id);
    if (it == destinations.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " has no destination buffer for shard ",
                       need.id.DebugString(), " (", need.NumBytes(), " bytes)"));
    }
    if (static_cast<int64_t>(it->second.size()) != need.NumBytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, "'s destination buffer for shard ", need.id.DebugString(),
                       " holds ", it->second.size(), " bytes but the shard has ", need.NumBytes()));
    }
    if (it->second.data() == nullptr && !it->second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, "'s destination buffer for shard ", need.id.DebugString(), " is null"));
    }
    targets.push_back(it->second);
  }
  if (destinations.size() != seen.size()) {
    for (const auto& [id, span] : destinations) {
      if (!seen.contains(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, " was given a destination buffer for shard ",
                         id.DebugString(), " which it does not need"));
      }
    }
  }
  // No two destinations may share memory, and none may share memory with a loaded buffer other
  // than the one stored under its own id.
  struct Range {
    const char* begin;
    const char* end;
    const PieceId* id;
    bool is_loaded;
  };
  std::vector<Range> ranges;
  for (const auto& [id, span] : destinations) {
    if (!span.empty()) ranges.push_back({span.data(), span.data() + span.size(), &id, false});
  }
  for (const auto& [id, bytes] : loaded) {
    if (!bytes.empty()) ranges.push_back({bytes.data(), bytes.data() + bytes.size(), &id, true});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.is_loaded < b.is_loaded;
  });
  const Range* reach = nullptr;  // the range reaching furthest so far
  for (const Range& r : ranges) {
    if (reach != nullptr && r.begin < reach->end) {
      const bool same_buffer = reach->is_loaded != r.is_loaded && reach->begin == r.begin &&
                               reach->end == r.end && *reach->id == *r.id;
      if (!same_buffer && !(reach->is_loaded && r.is_loaded)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, "'s destination buffer for shard ",
                         (reach->is_loaded ? r.id : reach->id)->DebugString(), " overlaps the ",
                         (reach->is_loaded || r.is_loaded) ? "loaded buffer" : "destination buffer",
                         " of shard ", (reach->is_loaded ? reach->id : r.id)->DebugString()));
      }
    }
    if (reach == nullptr || r.end > reach->end) reach = &r;
  }
  return targets;
}

void CopyLoaded(const std::string& loaded, absl::Span<char> destination) {
  if (!loaded.empty() && loaded.data() != destination.data()) {
    std::memcpy(destination.data(), loaded.data(), loaded.size());
  }
}

absl::StatusOr<ShardBuffers> RunAllocating(IntoAlgorithm into, Communicator& comm,
                                           const ExchangePlan& plan, const ShardBuffers& loaded,
                                           const ExchangeOptions& options, ExchangeReport* report) {
  CKPT_RETURN_IF_ERROR(CheckPlanShape(plan, comm));
  CKPT_ASSIGN_OR_RETURN(ShardBuffers out, AllocateOutputs(plan, comm.rank()));
  CKPT_RETURN_IF_ERROR(into(comm, plan, loaded, DestinationsOf(out), options, report));
  return out;
}

void WaveRecorder::Add(int64_t staging, int64_t sent, int64_t received, absl::Duration time) {
  if (waves_.empty() || (waves_.back().collectives > 0 && wave_staging_ + staging > budget_)) {
    waves_.emplace_back();
    wave_staging_ = 0;
  }
  WaveStats& w = waves_.back();
  wave_staging_ += staging;
  w.bytes_sent += sent;
  w.bytes_received += received;
  w.collectives += 1;
  w.time += time;
}

void WaveRecorder::StartWave() {
  waves_.emplace_back();
  wave_staging_ = 0;
}

void WaveRecorder::Finish(absl::string_view algorithm, ExchangeReport* report) {
  if (report == nullptr) return;
  report->algorithm = std::string(algorithm);
  report->waves = waves_;
}

void ReadSegments(absl::Span<const Segment> segments, size_t offset, size_t size, char* dst) {
  size_t base = 0;
  for (const Segment& s : segments) {
    if (size == 0) return;
    if (offset < base + s.size) {
      size_t from = offset - base;
      size_t n = std::min(size, s.size - from);
      std::memcpy(dst, s.data + from, n);
      dst += n;
      offset += n;
      size -= n;
    }
    base += s.size;
  }
}

absl::Status ChunkedAllGatherV(Communicator& comm, absl::Span<const Segment> mine,
                               absl::Span<const size_t> sizes, int64_t budget, absl::Time deadline,
                               WaveRecorder& waves, StagingArena& staging, const ChunkSink& sink) {
  const int n = comm.size();
  const int me = comm.rank();
  const size_t chunk = std::max<int64_t>(1, budget / (n + 1));
  const size_t longest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  // Send window, then the largest receive window: one staging block for every sub-round.
  const size_t send_capacity = std::min(chunk, sizes[me]);
  size_t recv_capacity = 0;
  for (size_t size : sizes) recv_capacity += std::min(chunk, size);
  CKPT_ASSIGN_OR_RETURN(char* block, staging.Reserve(send_capacity + recv_capacity));
  char* const send = block;
  char* const recv = block + send_capacity;
  for (size_t window = 0; window < longest; window += chunk) {
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (int r = 0; r < n; ++r) {
      counts[r] = sizes[r] > window ? std::min(chunk, sizes[r] - window) : 0;
      total += counts[r];
    }
    if (total == 0) continue;
    ReadSegments(mine, window, counts[me], send);
    absl::Time start = absl::Now();
    CKPT_RETURN_IF_ERROR(comm.AllGatherV(send, counts, recv, deadline));
    waves.Add(static_cast<int64_t>(total + counts[me]), counts[me] * (n - 1), total - counts[me],
              absl::Now() - start);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      if (counts[r] > 0) sink(r, window, recv + at, counts[r]);
      at += counts[r];
    }
  }
  return absl::OkStatus();
}

}  // namespace exchange_internal

DestinationBuffers DestinationsOf(ShardBuffers& buffers) {
  DestinationBuffers destinations;
  for (auto& [id, bytes] : buffers)
    destinations.emplace(id, absl::Span<char>(bytes.data(), bytes.size()));
  return destinations;
}

int64_t ExchangeReport::bytes_sent() const {
  int64_t total = 0;
  for (const WaveStats& w : waves) total += w.bytes_sent;
  return total;
}

int64_t ExchangeReport::bytes_received() const {
  int64_t total = 0;
  for (const WaveStats& w : waves) total += w.bytes_received;
  return total;
}

int64_t ExchangeReport::collectives() const {
  int64_t total = 0;
  for (const WaveStats& w : waves) total += w.collectives;
  return total;
}

}  // namespace ckpt
