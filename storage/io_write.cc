// The I/O engine's write path: whole files from in-memory segments, checksummed as they stream.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

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

class FileWriter {
 public:
  FileWriter(Lane& lane, const FileWrite& fw, int fd, bool direct, int64_t buffer_bytes)
      : lane_(lane), fw_(fw), fd_(fd), direct_(direct), buffer_bytes_(buffer_bytes) {}
  // On error paths: wait for the kernel, then give slots and buffers back to the lane.
  ~FileWriter() {
    lane_.Drain();
    for (auto& [op, b] : owned_) {
      lane_.ReturnBuffer(b);
      lane_.FreeSlot(op);
    }
    lane_.ReturnBuffer(buf_);
  }

  absl::Status Write(FileWriteResult* out) {
    out->checksums.resize(fw_.segments.size());
    int64_t pos = 0;
    char*& buf = buf_;
    int64_t fill = 0;
    for (size_t si = 0; si < fw_.segments.size(); ++si) {
      const WriteSegment& seg = fw_.segments[si];
      std::optional<StreamingChecksum> cs;
      if (seg.checksum) cs.emplace(seg.block_bytes);
      const char* src = static_cast<const char*>(seg.data);
      if (!direct_) {
        CKPT_RETURN_IF_ERROR(WriteBuffered(src, seg.size, cs ? &*cs : nullptr, &pos));
        if (cs) out->checksums[si] = SegmentChecksum{cs->Whole(), cs->Blocks()};
        continue;
      }
      int64_t done = 0;
      while (done < seg.size) {
        // Zero copy: aligned source at an aligned file position goes straight to the device
        // (flushing a staging buffer that ends on a block boundary first).
        const char* s = src + done;
        if (reinterpret_cast<uintptr_t>(s) % kAlign == 0 && seg.size - done >= kAlign) {
          if (buf != nullptr && fill % kAlign == 0) {
            char* part = buf;
            buf = nullptr;
            CKPT_RETURN_IF_ERROR(Submit(part, fill, pos, part));
            pos += fill;
          }
          if (buf == nullptr) {
            const int64_t n = std::min(buffer_bytes_, seg.size - done) / kAlign * kAlign;
            if (cs) cs->Update(s, n);
            CKPT_RETURN_IF_ERROR(Submit(const_cast<char*>(s), n, pos, nullptr));
            pos += n;
            done += n;
            continue;
          }
        }
        if (buf == nullptr) {
          CKPT_ASSIGN_OR_RETURN(buf, GetBuffer());
          fill = 0;
        }
        const int64_t n = std::min({buffer_bytes_ - fill, seg.size - done, kHashSlice});
        std::memcpy(buf + fill, src + done, n);
        if (cs) cs->Update(buf + fill, n);
        fill += n;
        done += n;
        if (fill == buffer_bytes_) {
          char* full = buf;
          buf = nullptr;
          CKPT_RETURN_IF_ERROR(Submit(full, fill, pos, full));
          pos += fill;
        }
      }
      if (cs) out->checksums[si] = SegmentChecksum{cs->Whole(), cs->Blocks()};
    }
    CKPT_RETURN_IF_ERROR(FlushGathered(&pos));
    int64_t size = pos;
    if (buf != nullptr) {
      const int64_t padded = RoundUp(fill, kAlign);
      std::memset(buf + fill, 0, padded - fill);
      size = pos + fill;
      char* last = buf;
      buf = nullptr;
      CKPT_RETURN_IF_ERROR(Submit(last, padded, pos, last));
    }
    while (lane_.queue().inflight() > 0) CKPT_RETURN_IF_ERROR(ReapOne());
    if (direct_ && size % kAlign != 0 && ::ftruncate(fd_, size) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncate ", fw_.path));
    }
    out->size = size;
    return absl::OkStatus();
  }

 private:
  // Buffered (not O_DIRECT) writes straight from the segment's memory, except that small
  // segments are gathered into one write: a file of a million tiny pieces is then a few
  // hundred writes, not a million.
  absl::Status WriteBuffered(const char* src, int64_t size, StreamingChecksum* cs, int64_t* pos) {
    if (size < kGatherBelow) {
      if (cs != nullptr) cs->Update(src, size);
      if (gathered_ + size > kGatherBytes) CKPT_RETURN_IF_ERROR(FlushGathered(pos));
      if (gather_ == nullptr) gather_.reset(new char[kGatherBytes]);
      std::memcpy(gather_.get() + gathered_, src, size);
      gathered_ += size;
      return absl::OkStatus();
    }
    CKPT_RETURN_IF_ERROR(FlushGathered(pos));
    for (int64_t done = 0; done < size;) {
      const int64_t n = std::min(buffer_bytes_, size - done);
      if (cs != nullptr) cs->Update(src + done, n);  // hashing overlaps the previous write
      CKPT_RETURN_IF_ERROR(Submit(const_cast<char*>(src) + done, n, *pos, nullptr));
      *pos += n;
      done += n;
    }
    return absl::OkStatus();
  }

  // Writes the gathered small segments at *pos and waits for the kernel, so the gather buffer
  // can be refilled.
  absl::Status FlushGathered(int64_t* pos) {
    if (gathered_ == 0) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(Submit(gather_.get(), gathered_, *pos, nullptr));
    *pos += gathered_;
    gathered_ = 0;
    while (lane_.queue().inflight() > 0) CKPT_RETURN_IF_ERROR(ReapOne());
    return absl::OkStatus();
  }

  absl::StatusOr<char*> GetBuffer() {
    while (true) {
      if (char* b = lane_.TryBuffer()) return b;
      CKPT_RETURN_IF_ERROR(ReapOne());
    }
  }

  absl::Status Submit(char* data, int64_t n, int64_t pos, char* owned) {
    while (!lane_.HasFreeSlot()) CKPT_RETURN_IF_ERROR(ReapOne());
    IoOp* op = lane_.TakeSlot();
    op->write = true;
    op->fd = fd_;
    op->buf = data;
    op->length = n;
    op->offset = pos;
    owned_[op] = owned;
    return lane_.queue().Submit(op);
  }

  absl::Status ReapOne() {
    CKPT_ASSIGN_OR_RETURN(IoOp * op, lane_.queue().WaitAny());
    if (op == nullptr) return absl::InternalError("no write in flight");
    absl::Status s;
    if (op->result < 0) {
      if (direct_ && op->result == -EINVAL) {
        s = absl::FailedPreconditionError(absl::StrCat("O_DIRECT refused for ", fw_.path));
      } else {
        s = ErrnoStatus(static_cast<int>(-op->result), absl::StrCat("write ", fw_.path));
      }
    } else if (op->result < op->length) {
      auto rest = CompleteSync(*op, op->result);
      if (!rest.ok())
        s = ErrnoStatus(EIO, absl::StrCat("write ", fw_.path, ": ", rest.status().message()));
    }
    lane_.ReturnBuffer(owned_[op]);
    owned_.erase(op);
    lane_.FreeSlot(op);
    return s;
  }

  Lane& lane_;
  const FileWrite& fw_;
  int fd_;
  bool direct_;
  int64_t buffer_bytes_;
  std::map<IoOp*, char*> owned_;
  char* buf_ = nullptr;  // staging buffer being filled (direct only)
  // Buffered mode: segments below kGatherBelow bytes are copied here and written together.
  static constexpr int64_t kGatherBelow = int64_t{64} << 10;
  static constexpr int64_t kGatherBytes = int64_t{1} << 20;
  std::unique_ptr<char[]> gather_;
  int64_t gathered_ = 0;
};

absl::Status WriteOne(Lane& lane, const FileWrite& fw, const IoOptions& o, IoStats* stats,
                      FileWriteResult* out) {
  bool direct = o.direct_io;
  while (true) {
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = OpenFile(fw.path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      ++stats->direct_fallbacks;
      direct = false;
      fd = ::open(fw.path.c_str(), flags, 0644);
    }
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", fw.path));
    absl::Status s = FileWriter(lane, fw, fd, direct, o.buffer_bytes).Write(out);
    if (s.ok() && o.fsync) s = FsyncFd(fd, fw.path);
    ::close(fd);
    if (direct && IsDirectRefused(s)) {
      ++stats->direct_fallbacks;
      direct = false;
      continue;
    }
    if (!s.ok()) return s;
    ++(lane.queue().is_uring() ? stats->uring_files : stats->posix_files);
    if (direct) ++stats->direct_files;
    stats->bytes += out->size;
    return absl::OkStatus();
  }
}

}  // namespace

absl::StatusOr<std::vector<FileWriteResult>> WriteFiles(const std::vector<FileWrite>& files,
                                                        const IoOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  Run run(options);
  std::vector<FileWriteResult> results(files.size());
  // Largest files first so the threads finish together.
  std::vector<int64_t> sizes(files.size(), 0);
  for (size_t i = 0; i < files.size(); ++i) {
    for (const auto& s : files[i].segments) sizes[i] += s.size;
  }
  std::vector<size_t> order(files.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  CKPT_RETURN_IF_ERROR(ParallelFor(run, files.size(), order, [&](Lane& lane, size_t i) {
    IoStats local;
    absl::Status s = WriteOne(lane, files[i], options, &local, &results[i]);
    run.AddStats(local);
    return s;
  }));
  return results;
}

}  // namespace ckpt
