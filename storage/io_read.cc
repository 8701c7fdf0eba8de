// The I/O engine's read path: byte ranges into caller memory, verified as they stream.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checksum.h"
#include "storage/file_util.h"
#include "storage/io_engine.h"
#include "storage/io_lane.h"
#include "storage/io_queue.h"

namespace ckpt {
namespace {

using namespace io_internal;  // NOLINT: the engine's own internals

// Descriptors for every file read in one call, opened up front and shared by all threads.
struct OpenFiles {
  std::map<std::string, std::pair<int, int>> fds;  // path -> (buffered fd, O_DIRECT fd or -1)
  ~OpenFiles() {
    for (auto& [path, p] : fds) {
      if (p.first >= 0) ::close(p.first);
      if (p.second >= 0) ::close(p.second);
    }
  }
};

// One range being read: its request, descriptor, checksum state and chunks left to consume.
struct RangeState {
  const RangeRead* r = nullptr;
  int fd = -1;
  bool direct = false;
  std::unique_ptr<StreamingChecksum> cs;
  int64_t chunks_left = 0;
};

struct ChunkState {
  IoOp* op = nullptr;
  int64_t file_pos = 0;  // where the op's buffer starts in the file
  char* staging = nullptr;
  RangeState* range = nullptr;
};

// Reads a batch of ranges on one lane with their chunks pipelined through the queue, so small
// ranges (one chunk each) still keep queue_depth transfers in flight; chunks are consumed
// (copied out of staging, hashed) in submission order, which keeps each range's hash streaming.
class BatchReader {
 public:
  BatchReader(Lane& lane, int64_t buffer_bytes) : lane_(lane), buffer_bytes_(buffer_bytes) {}
  ~BatchReader() {
    lane_.Drain();
    for (const ChunkState& c : fifo_) {
      lane_.ReturnBuffer(c.staging);
      lane_.FreeSlot(c.op);
    }
  }

  // `ranges` stay owned by the caller; each must outlive the call.
  absl::Status Read(std::vector<RangeState>& ranges) {
    for (RangeState& rs : ranges) {
      const RangeRead& r = *rs.r;
      rs.cs = std::make_unique<StreamingChecksum>(r.verify ? r.block_bytes : 0);
      const int64_t begin = rs.direct ? RoundDown(r.offset, kAlign) : r.offset;
      const int64_t end = rs.direct ? RoundUp(r.offset + r.length, kAlign) : r.offset + r.length;
      rs.chunks_left = (end - begin + buffer_bytes_ - 1) / buffer_bytes_;
      if (rs.chunks_left == 0) CKPT_RETURN_IF_ERROR(Finish(rs));
      for (int64_t pos = begin; pos < end;) {
        const int64_t n = std::min(buffer_bytes_, end - pos);
        while (!lane_.HasFreeSlot()) CKPT_RETURN_IF_ERROR(ReapOne());
        char* in_place = static_cast<char*>(r.dest) + (pos - r.offset);
        const bool inside = pos >= r.offset && pos + n <= r.offset + r.length;
        char* staging = nullptr;
        if (rs.direct && !(inside && reinterpret_cast<uintptr_t>(in_place) % kAlign == 0)) {
          while ((staging = lane_.TryBuffer()) == nullptr) CKPT_RETURN_IF_ERROR(ReapOne());
        }
        IoOp* op = lane_.TakeSlot();
        op->write = false;
        op->fd = rs.fd;
        op->buf = staging != nullptr ? staging : in_place;
        op->length = n;
        op->offset = pos;
        fifo_.push_back(ChunkState{op, pos, staging, &rs});
        CKPT_RETURN_IF_ERROR(lane_.queue().Submit(op));
        pos += n;
      }
    }
    while (!fifo_.empty()) CKPT_RETURN_IF_ERROR(ReapOne());
    return absl::OkStatus();
  }

 private:
  static absl::Status Mismatch(const RangeRead& r, absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checksum mismatch reading ", r.label, " from ", r.path,
                                            " at [", r.offset, ", ", r.offset + r.length,
                                            "): ", what));
  }

  // All of a range's bytes are in place: check its checksums.
  static absl::Status Finish(const RangeState& rs) {
    const RangeRead& r = *rs.r;
    if (!r.verify) return absl::OkStatus();
    if (r.block_bytes == 0) {
      if (r.expected.size() != 1 || rs.cs->Whole() != r.expected[0]) {
        return Mismatch(r, absl::StrCat("XXH3-64 ", rs.cs->Whole(), " != expected ",
                                        r.expected.empty() ? 0 : r.expected[0]));
      }
      return absl::OkStatus();
    }
    const std::vector<uint64_t> blocks = rs.cs->Blocks();
    if (blocks.size() != r.expected.size()) {
      return Mismatch(r, absl::StrCat(blocks.size(), " blocks read, ", r.expected.size(),
                                      " checksums expected"));
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] != r.expected[i]) {
        return Mismatch(
            r, absl::StrCat("block ", i, " (bytes [",
                            r.offset + static_cast<int64_t>(i) * r.block_bytes,
                            ", ...)) has XXH3-64 ", blocks[i], ", expected ", r.expected[i]));
      }
    }
    return absl::OkStatus();
  }

  // Waits for one completion, then consumes completed chunks at the head of the FIFO in order.
  absl::Status ReapOne() {
    CKPT_ASSIGN_OR_RETURN(IoOp * op, lane_.queue().WaitAny());
    if (op == nullptr) return absl::InternalError("no read in flight");
    const ChunkState* mine = nullptr;
    for (const ChunkState& c : fifo_) {
      if (c.op == op) mine = &c;
    }
    const RangeState& rs = *mine->range;
    if (op->result < 0) {
      if (rs.direct && op->result == -EINVAL) {
        return absl::FailedPreconditionError(absl::StrCat("O_DIRECT refused for ", rs.r->path));
      }
      return ErrnoStatus(static_cast<int>(-op->result), absl::StrCat("read ", rs.r->path));
    }
    int64_t got = op->result;
    if (got < op->length && (!rs.direct || got % kAlign == 0)) {
      CKPT_ASSIGN_OR_RETURN(int64_t more, CompleteSync(*op, got));
      got += more;
    }
    op->result = got;
    op->done = true;
    while (!fifo_.empty() && fifo_.front().op->done) {
      ChunkState c = fifo_.front();
      fifo_.pop_front();
      absl::Status s = Consume(c);
      lane_.ReturnBuffer(c.staging);
      lane_.FreeSlot(c.op);
      CKPT_RETURN_IF_ERROR(s);
      if (--c.range->chunks_left == 0) CKPT_RETURN_IF_ERROR(Finish(*c.range));
    }
    return absl::OkStatus();
  }

  static absl::Status Consume(const ChunkState& c) {
    const RangeRead& r = *c.range->r;
    const int64_t want_begin = std::max(c.file_pos, r.offset);
    const int64_t want_end = std::min(c.file_pos + c.op->length, r.offset + r.length);
    if (c.file_pos + c.op->result < want_end) {
      return absl::DataLossError(absl::StrCat(r.path, " is truncated: reading ", r.label,
                                              " needs bytes up to ", r.offset + r.length,
                                              " but the file ends at ", c.file_pos + c.op->result));
    }
    char* dest = static_cast<char*>(r.dest) + (want_begin - r.offset);
    const int64_t n = want_end - want_begin;
    if (c.staging == nullptr) {
      if (r.verify) c.range->cs->Update(dest, n);
      return absl::OkStatus();
    }
    const char* src = c.staging + (want_begin - c.file_pos);
    for (int64_t k = 0; k < n; k += kHashSlice) {
      const int64_t m = std::min(kHashSlice, n - k);
      std::memcpy(dest + k, src + k, m);
      if (r.verify) c.range->cs->Update(dest + k, m);
    }
    return absl::OkStatus();
  }

  Lane& lane_;
  int64_t buffer_bytes_;
  std::deque<ChunkState> fifo_;
};

// Groups ranges (largest first) into per-thread batches: a range of at least one buffer is
// pipelined by its own chunks; smaller ones are batched so each batch keeps the queue busy,
// while leaving at least one batch per thread.
std::vector<std::vector<size_t>> MakeBatches(const std::vector<RangeRead>& reads,
                                             const IoOptions& o) {
  std::vector<size_t> order(reads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return reads[a].length > reads[b].length; });
  std::vector<std::vector<size_t>> batches;
  size_t small = 0;
  for (size_t i : order) small += reads[i].length < o.buffer_bytes ? 1 : 0;
  const size_t per_batch = std::max<size_t>(
      1, std::min<size_t>(4 * o.queue_depth, (small + o.num_threads - 1) / o.num_threads));
  for (size_t i : order) {
    if (reads[i].length >= o.buffer_bytes || batches.empty() ||
        reads[batches.back().front()].length >= o.buffer_bytes ||
        batches.back().size() >= per_batch) {
      batches.emplace_back();
    }
    batches.back().push_back(i);
  }
  return batches;
}

}  // namespace

absl::Status ReadRanges(const std::vector<RangeRead>& reads, const IoOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  Run run(options);
  OpenFiles files;
  IoStats open_stats;
  for (const RangeRead& r : reads) {
    if (r.offset < 0 || r.length < 0 || (r.length > 0 && r.dest == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("bad read of ", r.label, " from ", r.path,
                                                     ": offset ", r.offset, " length ", r.length));
    }
    if (files.fds.count(r.path)) continue;
    int fd = ::open(r.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", r.path));
    int dfd = -1;
    if (options.direct_io) {
      dfd = OpenFile(r.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (dfd < 0) ++open_stats.direct_fallbacks;
    }
    files.fds[r.path] = {fd, dfd};
  }
  run.AddStats(open_stats);
  const std::vector<std::vector<size_t>> batches = MakeBatches(reads, options);
  std::vector<size_t> order(batches.size());
  std::iota(order.begin(), order.end(), 0);
  return ParallelFor(run, batches.size(), order, [&](Lane& lane, size_t b) {
    auto attempt = [&](bool allow_direct, std::vector<RangeState>* states) {
      states->clear();
      for (size_t i : batches[b]) {
        const auto& [fd, dfd] = files.fds.at(reads[i].path);
        RangeState rs;
        rs.r = &reads[i];
        rs.direct = allow_direct && dfd >= 0;
        rs.fd = rs.direct ? dfd : fd;
        states->push_back(std::move(rs));
      }
      return BatchReader(lane, options.buffer_bytes).Read(*states);
    };
    IoStats local;
    std::vector<RangeState> states;
    absl::Status s = attempt(true, &states);
    if (IsDirectRefused(s)) {
      lane.Drain();
      ++local.direct_fallbacks;
      s = attempt(false, &states);
    }
    if (s.ok()) {
      for (const RangeState& rs : states) {
        ++(lane.queue().is_uring() ? local.uring_files : local.posix_files);
        if (rs.direct) ++local.direct_files;
        local.bytes += rs.r->length;
      }
    }
    run.AddStats(local);
    return s;
  });
}

}  // namespace ckpt
