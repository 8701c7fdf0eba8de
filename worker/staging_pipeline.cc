#include "worker/staging_pipeline.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kMinBudgetBytes = 8192;

// A copy issued and not consumed yet.
struct InFlight {
  int chunk = 0;
  int buffer = 0;
  uint64_t ticket = 0;
  bool waited = false;
};

std::string Describe(const std::string& who, absl::Span<const DeviceRange> ranges,
                     const ChunkSpec& c) {
  return absl::StrCat(who, ": tensor ", ranges[c.range].key, " bytes [", c.offset, ", ",
                      c.offset + c.bytes, ")");
}

absl::Status Annotate(const absl::Status& s, const std::string& where, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", what, ": ", s.message()));
}

// Waits for every copy still in flight (their buffers and the trainer's memory are in use until
// then); the first error has been reported already.
void Drain(CopyEngine* engine, std::deque<InFlight>& in_flight, absl::Time deadline) {
  for (InFlight& f : in_flight) {
    if (!f.waited) (void)engine->Wait(f.ticket, deadline);
  }
  in_flight.clear();
}

}  // namespace

PinnedStagingPool::PinnedStagingPool(CopyEngine* engine, int64_t budget_bytes, int64_t chunk_bytes)
    : engine_(engine), budget_bytes_(budget_bytes) {
  chunk_bytes_ = std::max<int64_t>(1, std::min(chunk_bytes, budget_bytes / 2));
  num_buffers_ = static_cast<int>(std::max<int64_t>(2, budget_bytes / chunk_bytes_));
}

absl::StatusOr<PinnedStagingPool::Lease> PinnedStagingPool::Acquire(absl::Time deadline) {
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  if (!lock.try_lock_until(absl::ToChronoTime(deadline))) {
    return absl::DeadlineExceededError(
        absl::StrCat("the worker's pinned staging (", budget_bytes_,
                     " bytes) stayed busy with another save or load until the deadline"));
  }
  if (budget_bytes_ < kMinBudgetBytes) {
    return absl::InvalidArgumentError(absl::StrCat("pinned staging budget of ", budget_bytes_,
                                                   " bytes is under the minimum of ",
                                                   kMinBudgetBytes));
  }
  if (buffers_.empty()) {
    std::vector<PinnedBuffer> buffers;
    for (int i = 0; i < num_buffers_; ++i) {
      absl::StatusOr<PinnedBuffer> b = engine_->AllocatePinned(static_cast<size_t>(chunk_bytes_));
      if (!b.ok()) {
        return Annotate(b.status(), absl::StrCat("pinned staging on ", engine_->name()),
                        absl::StrCat("buffer ", i + 1, " of ", num_buffers_));
      }
      buffers.push_back(*std::move(b));
    }
    buffers_ = std::move(buffers);
  }
  return Lease(this, std::move(lock));
}

std::vector<ChunkSpec> CutIntoChunks(absl::Span<const DeviceRange> ranges, int64_t chunk_bytes) {
  std::vector<ChunkSpec> chunks;
  for (int r = 0; r < static_cast<int>(ranges.size()); ++r) {
    for (int64_t offset = 0; offset < ranges[r].bytes; offset += chunk_bytes) {
      chunks.push_back(ChunkSpec{r, offset, std::min(chunk_bytes, ranges[r].bytes - offset)});
    }
  }
  return chunks;
}

absl::Status StageDeviceToHost(PinnedStagingPool::Lease& lease,
                               absl::Span<const DeviceRange> ranges, const std::string& who,
                               const std::function<absl::Status()>& stop,
                               const std::function<absl::Status(const StagedChunk&)>& consume,
                               const std::function<void()>& on_drained, absl::Time deadline,
                               StagingStats* stats) {
  StagingStats local;
  if (stats == nullptr) stats = &local;
  *stats = StagingStats();
  const absl::Time start = absl::Now();
  CopyEngine* engine = lease.engine();
  const std::vector<ChunkSpec> chunks = CutIntoChunks(ranges, lease.chunk_bytes());
  const int num_buffers = static_cast<int>(lease.buffers().size());
  stats->over_budget = static_cast<int64_t>(chunks.size()) > num_buffers;
  std::vector<int> free_buffers;
  for (int b = num_buffers - 1; b >= 0; --b) free_buffers.push_back(b);
  std::deque<InFlight> in_flight;
  bool drained = false;
  auto signal_drained = [&] {
    drained = true;
    stats->until_drained = absl::Now() - start;
    if (on_drained) on_drained();
  };
  // Drains what is in flight and names the chunk `c` that failed and the step.
  auto fail = [&](const absl::Status& s, const ChunkSpec& c, const std::string& step) {
    Drain(engine, in_flight, deadline);
    return Annotate(s, Describe(who, ranges, c), step);
  };
  const std::string copying = absl::StrCat("copying off the device on ", engine->name());
  if (chunks.empty()) signal_drained();
  size_t next = 0;
  while (next < chunks.size() || !in_flight.empty()) {
    while (next < chunks.size() && !free_buffers.empty()) {
      const ChunkSpec& c = chunks[next];
      absl::Status s = stop ? stop() : absl::OkStatus();
      if (!s.ok()) return fail(s, c, "stopped before copying it off the device");
      const int buffer = free_buffers.back();
      absl::StatusOr<uint64_t> ticket =
          engine->Enqueue(CopyDirection::kDeviceToHost, lease.buffers()[buffer].data(),
                          static_cast<const std::byte*>(ranges[c.range].device) + c.offset,
                          static_cast<size_t>(c.bytes));
      if (!ticket.ok()) return fail(ticket.status(), c, copying);
      free_buffers.pop_back();
      in_flight.push_back(InFlight{static_cast<int>(next), buffer, *ticket});
      ++next;
    }
    if (next == chunks.size() && !drained) {
      // Everything is issued; copies complete in order, so once the last one has, every
      // device byte has left device memory.
      InFlight& last = in_flight.back();
      last.waited = true;
      if (absl::Status s = engine->Wait(last.ticket, deadline); !s.ok()) {
        return fail(s, chunks[last.chunk], copying);
      }
      signal_drained();
    }
    InFlight front = in_flight.front();
    in_flight.pop_front();
    const ChunkSpec& c = chunks[front.chunk];
    if (!front.waited) {
      if (absl::Status s = engine->Wait(front.ticket, deadline); !s.ok()) {
        return fail(s, c, copying);
      }
    }
    absl::Status s =
        consume(StagedChunk{c.range, c.offset, c.bytes, lease.buffers()[front.buffer].data()});
    if (!s.ok()) return fail(s, c, "consuming the staged chunk");
    stats->bytes += c.bytes;
    if (!drained) stats->bytes_consumed_before_drained += c.bytes;
    ++stats->chunks;
    free_buffers.push_back(front.buffer);
  }
  return absl::OkStatus();
}

absl::Status StageHostToDevice(PinnedStagingPool::Lease& lease,
                               absl::Span<const DeviceRange> ranges,
                               absl::Span<const ChunkSpec> chunks, const std::string& who,
                               const std::function<absl::Status()>& stop,
                               const std::function<absl::Status(const StagedChunk&)>& produce,
                               absl::Time deadline, StagingStats* stats) {
  StagingStats local;
  if (stats == nullptr) stats = &local;
  *stats = StagingStats();
  CopyEngine* engine = lease.engine();
  const int num_buffers = static_cast<int>(lease.buffers().size());
  stats->over_budget = static_cast<int64_t>(chunks.size()) > num_buffers;
  std::deque<InFlight> in_flight;
  std::vector<int> free_buffers;
  for (int b = num_buffers - 1; b >= 0; --b) free_buffers.push_back(b);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkSpec& c = chunks[i];
    if (c.range < 0 || c.range >= static_cast<int>(ranges.size()) || c.offset < 0 ||
        c.bytes > lease.chunk_bytes() || c.offset + c.bytes > ranges[c.range].bytes) {
      Drain(engine, in_flight, deadline);
      return absl::InternalError(absl::StrCat(who, ": chunk ", i, " lies outside its range"));
    }
    if (free_buffers.empty()) {  // reuse the buffer of the oldest copy once it completed
      InFlight oldest = in_flight.front();
      in_flight.pop_front();
      if (absl::Status s = engine->Wait(oldest.ticket, deadline); !s.ok()) {
        Drain(engine, in_flight, deadline);
        return Annotate(s, Describe(who, ranges, chunks[oldest.chunk]),
                        absl::StrCat("copying onto the device on ", engine->name()));
      }
      free_buffers.push_back(oldest.buffer);
    }
    absl::Status s = stop ? stop() : absl::OkStatus();
    const int buffer = free_buffers.back();
    if (s.ok())
      s = produce(StagedChunk{c.range, c.offset, c.bytes, lease.buffers()[buffer].data()});
    if (!s.ok()) {
      Drain(engine, in_flight, deadline);
      return Annotate(s, Describe(who, ranges, c), "staging it for the device");
    }
    absl::StatusOr<uint64_t> ticket = engine->Enqueue(
        CopyDirection::kHostToDevice, static_cast<std::byte*>(ranges[c.range].device) + c.offset,
        lease.buffers()[buffer].data(), static_cast<size_t>(c.bytes));
    if (!ticket.ok()) {
      Drain(engine, in_flight, deadline);
      return Annotate(ticket.status(), Describe(who, ranges, c),
                      absl::StrCat("copying onto the device on ", engine->name()));
    }
    free_buffers.pop_back();
    in_flight.push_back(InFlight{static_cast<int>(i), buffer, *ticket});
    stats->bytes += c.bytes;
    ++stats->chunks;
  }
  while (!in_flight.empty()) {
    InFlight f = in_flight.front();
    in_flight.pop_front();
    if (absl::Status s = engine->Wait(f.ticket, deadline); !s.ok()) {
      Drain(engine, in_flight, deadline);
      return Annotate(s, Describe(who, ranges, chunks[f.chunk]),
                      absl::StrCat("copying onto the device on ", engine->name()));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
