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

struct ChunkState {
  IoOp* op = nullptr;
  int64_t file_pos = 0;  // where the op's buffer starts in the file
  char* staging = nullptr;
};

class RangeReader {
 public:
  RangeReader(Lane& lane, const RangeRead& r, int fd, bool direct, int64_t buffer_bytes)
      : lane_(lane),
        r_(r),
        fd_(fd),
        direct_(direct),
        buffer_bytes_(buffer_bytes),
        cs_(r.verify ? r.block_bytes : 0) {}
  ~RangeReader() {
    lane_.Drain();
    for (const ChunkState& c : fifo_) {
      lane_.ReturnBuffer(c.staging);
      lane_.FreeSlot(c.op);
    }
  }

  absl::Status Read() {
    const int64_t begin = direct_ ? RoundDown(r_.offset, kAlign) : r_.offset;
    const int64_t end = direct_ ? RoundUp(r_.offset + r_.length, kAlign) : r_.offset + r_.length;
    for (int64_t pos = begin; pos < end;) {
      const int64_t n = std::min(buffer_bytes_, end - pos);
      while (!lane_.HasFreeSlot()) CKPT_RETURN_IF_ERROR(ReapOne());
      char* target;
      char* staging = nullptr;
      char* in_place = static_cast<char*>(r_.dest) + (pos - r_.offset);
      const bool inside = pos >= r_.offset && pos + n <= r_.offset + r_.length;
      if (direct_ && !(inside && reinterpret_cast<uintptr_t>(in_place) % kAlign == 0)) {
        while ((staging = lane_.TryBuffer()) == nullptr) CKPT_RETURN_IF_ERROR(ReapOne());
        target = staging;
      } else {
        target = static_cast<char*>(r_.dest) + (pos - r_.offset);
      }
      IoOp* op = lane_.TakeSlot();
      op->write = false;
      op->fd = fd_;
      op->buf = target;
      op->length = n;
      op->offset = pos;
      fifo_.push_back(ChunkState{op, pos, staging});
      CKPT_RETURN_IF_ERROR(lane_.queue().Submit(op));
      pos += n;
    }
    while (!fifo_.empty()) CKPT_RETURN_IF_ERROR(ReapOne());
    if (!r_.verify) return absl::OkStatus();
    if (r_.block_bytes == 0) {
      if (r_.expected.size() != 1 || cs_.Whole() != r_.expected[0]) {
        return Mismatch(absl::StrCat("XXH3-64 ", cs_.Whole(), " != expected ",
                                     r_.expected.empty() ? 0 : r_.expected[0]));
      }
      return absl::OkStatus();
    }
    const std::vector<uint64_t> blocks = cs_.Blocks();
    if (blocks.size() != r_.expected.size()) {
      return Mismatch(
          absl::StrCat(blocks.size(), " blocks read, ", r_.expected.size(), " checksums expected"));
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] != r_.expected[i]) {
        return Mismatch(absl::StrCat(
            "block ", i, " (bytes [", r_.offset + static_cast<int64_t>(i) * r_.block_bytes,
            ", ...)) has XXH3-64 ", blocks[i], ", expected ", r_.expected[i]));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Mismatch(absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checksum mismatch reading ", r_.label, " from ",
                                            r_.path, " at [", r_.offset, ", ",
                                            r_.offset + r_.length, "): ", what));
  }

  // Waits for one completion, then consumes completed chunks at the head of the FIFO in order.
  absl::Status ReapOne() {
    CKPT_ASSIGN_OR_RETURN(IoOp * op, lane_.queue().WaitAny());
    if (op == nullptr) return absl::InternalError("no read in flight");
    if (op->result < 0) {
      if (direct_ && op->result == -EINVAL) {
        return absl::FailedPreconditionError(absl::StrCat("O_DIRECT refused for ", r_.path));
      }
      return ErrnoStatus(static_cast<int>(-op->result), absl::StrCat("read ", r_.path));
    }
    int64_t got = op->result;
    if (got < op->length && (!direct_ || got % kAlign == 0)) {
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
    }
    return absl::OkStatus();
  }

  absl::Status Consume(const ChunkState& c) {
    const int64_t want_begin = std::max(c.file_pos, r_.offset);
    const int64_t want_end = std::min(c.file_pos + c.op->length, r_.offset + r_.length);
    if (c.file_pos + c.op->result < want_end) {
      return absl::DataLossError(absl::StrCat(r_.path, " is truncated: reading ", r_.label,
                                              " needs bytes up to ", r_.offset + r_.length,
                                              " but the file ends at ", c.file_pos + c.op->result));
    }
    char* dest = static_cast<char*>(r_.dest) + (want_begin - r_.offset);
    const int64_t n = want_end - want_begin;
    if (c.staging == nullptr) {
      if (r_.verify) cs_.Update(dest, n);
      return absl::OkStatus();
    }
    const char* src = c.staging + (want_begin - c.file_pos);
    for (int64_t k = 0; k < n; k += kHashSlice) {
      const int64_t m = std::min(kHashSlice, n - k);
      std::memcpy(dest + k, src + k, m);
      if (r_.verify) cs_.Update(dest + k, m);
    }
    return absl::OkStatus();
  }

  Lane& lane_;
  const RangeRead& r_;
  int fd_;
  bool direct_;
  int64_t buffer_bytes_;
  StreamingChecksum cs_;
  std::deque<ChunkState> fifo_;
};

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
  std::vector<size_t> order(reads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return reads[a].length > reads[b].length; });
  return ParallelFor(run, reads.size(), order, [&](Lane& lane, size_t i) {
    const RangeRead& r = reads[i];
    const auto& [fd, dfd] = files.fds.at(r.path);
    IoStats local;
    bool direct = dfd >= 0;
    absl::Status s = RangeReader(lane, r, direct ? dfd : fd, direct, options.buffer_bytes).Read();
    if (direct && IsDirectRefused(s)) {
      lane.Drain();
      ++local.direct_fallbacks;
      direct = false;
      s = RangeReader(lane, r, fd, false, options.buffer_bytes).Read();
    }
    if (s.ok()) {
      ++(lane.queue().is_uring() ? local.uring_files : local.posix_files);
      if (direct) ++local.direct_files;
      local.bytes += r.length;
    }
    run.AddStats(local);
    return s;
  });
}

}  // namespace ckpt
