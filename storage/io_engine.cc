#include "storage/io_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checksum.h"
#include "storage/file_util.h"
#include "storage/io_queue.h"

namespace ckpt {
namespace {

constexpr int64_t kAlign = 4096;
constexpr int64_t kHashSlice = int64_t{256} << 10;  // copy+hash granularity (stays in L2)

std::atomic<bool> refuse_direct_for_testing{false};

// open(2), except that O_DIRECT fails with EINVAL (as on filesystems without it) while the
// test hook is set.
int OpenFile(const char* path, int flags, mode_t mode = 0) {
  if ((flags & O_DIRECT) != 0 && refuse_direct_for_testing) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
int64_t RoundDown(int64_t v, int64_t a) { return v / a * a; }

// Hands out at most `capacity` aligned buffers of `bytes` each; allocated lazily, reused.
class BufferPool {
 public:
  BufferPool(int64_t bytes, int capacity) : bytes_(bytes), capacity_(capacity) {}
  ~BufferPool() {
    for (char* b : free_) std::free(b);
  }
  char* Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || allocated_ < capacity_; });
    if (!free_.empty()) {
      char* b = free_.back();
      free_.pop_back();
      return b;
    }
    ++allocated_;
    return static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(bytes_)));
  }
  void Release(char* b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
    }
    cv_.notify_one();
  }

 private:
  const int64_t bytes_;
  const int capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
  int allocated_ = 0;
};

// Per-thread transfer state: a queue, op slots, and up to `depth` staging buffers.
class Lane {
 public:
  Lane(std::unique_ptr<IoQueue> queue, int depth, BufferPool* pool)
      : queue_(std::move(queue)), slots_(depth), pool_(pool), depth_(depth) {
    for (int i = 0; i < depth; ++i) free_slots_.push_back(i);
  }
  ~Lane() {
    Drain();
    for (char* b : local_) pool_->Release(b);
  }

  IoQueue& queue() { return *queue_; }
  bool HasFreeSlot() const { return !free_slots_.empty(); }

  IoOp* TakeSlot() {
    int i = free_slots_.back();
    free_slots_.pop_back();
    slots_[i] = IoOp{};
    slots_[i].user = reinterpret_cast<void*>(static_cast<intptr_t>(i));
    return &slots_[i];
  }
  void FreeSlot(IoOp* op) { free_slots_.push_back(static_cast<int>(op - slots_.data())); }

  // A staging buffer if one is free locally or the per-lane limit allows taking one.
  char* TryBuffer() {
    if (!local_.empty()) {
      char* b = local_.back();
      local_.pop_back();
      return b;
    }
    if (held_ < depth_) {
      ++held_;
      return pool_->Acquire();
    }
    return nullptr;
  }
  void ReturnBuffer(char* b) {
    if (b != nullptr) local_.push_back(b);
  }

  // Waits for every in-flight op, discarding results (used on error paths).
  void Drain() {
    while (queue_->inflight() > 0) {
      if (!queue_->WaitAny().ok()) break;
    }
  }

 private:
  std::unique_ptr<IoQueue> queue_;
  std::vector<IoOp> slots_;
  std::vector<int> free_slots_;
  BufferPool* pool_;
  std::vector<char*> local_;
  int held_ = 0;
  int depth_;
};

// Shared by the threads of one WriteFiles / ReadRanges call.
struct Run {
  const IoOptions& options;
  BufferPool pool;
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  IoStats stats;

  explicit Run(const IoOptions& o)
      : options(o), pool(o.buffer_bytes, std::max(1, o.num_threads) * std::max(1, o.queue_depth)) {}

  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
    failed = true;
  }
  void AddStats(const IoStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    stats.uring_files += s.uring_files;
    stats.posix_files += s.posix_files;
    stats.direct_files += s.direct_files;
    stats.direct_fallbacks += s.direct_fallbacks;
    stats.bytes += s.bytes;
  }
};

absl::Status ValidateOptions(const IoOptions& o) {
  if (o.num_threads < 1 || o.queue_depth < 1 || o.buffer_bytes < kAlign ||
      o.buffer_bytes % kAlign != 0 || o.buffer_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad I/O options: num_threads ", o.num_threads, ", queue_depth ", o.queue_depth,
        ", buffer_bytes ", o.buffer_bytes, " (must be a multiple of 4096 up to 1 GiB)"));
  }
  if (o.backend == IoBackend::kUring && !UringAvailable()) {
    return absl::UnavailableError("io_uring was requested but is not available here");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IoQueue>> MakeQueue(const IoOptions& o) {
  if (o.backend != IoBackend::kPosix && UringAvailable()) {
    auto q = MakeUringQueue(o.queue_depth);
    if (q.ok() || o.backend == IoBackend::kUring) return q;
  }
  return MakePosixQueue();
}

// Runs `work(lane, index)` for indices [0, n) on up to num_threads threads, stopping early
// after the first failure.
template <typename Work>
absl::Status ParallelFor(Run& run, size_t n, const std::vector<size_t>& order, Work work) {
  std::atomic<size_t> next{0};
  auto body = [&] {
    auto queue = MakeQueue(run.options);
    if (!queue.ok()) {
      run.Fail(queue.status());
      return;
    }
    Lane lane(std::move(*queue), run.options.queue_depth, &run.pool);
    while (!run.failed) {
      size_t i = next.fetch_add(1);
      if (i >= n) break;
      absl::Status s = work(lane, order[i]);
      if (!s.ok()) {
        lane.Drain();
        run.Fail(std::move(s));
      }
    }
  };
  const size_t threads = std::min<size_t>(n, static_cast<size_t>(run.options.num_threads));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(body);
  if (threads > 0) body();
  for (auto& t : pool) t.join();
  if (run.options.stats != nullptr) *run.options.stats = run.stats;
  return run.first_error;
}

// Marker for "O_DIRECT refused by the filesystem, retry buffered".
bool IsDirectRefused(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition &&
         s.message().find("O_DIRECT refused") != absl::string_view::npos;
}

// --- writes -------------------------------------------------------------------------------

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
      std::unique_ptr<StreamingChecksum> cs;
      if (seg.checksum) cs = std::make_unique<StreamingChecksum>(seg.block_bytes);
      const char* src = static_cast<const char*>(seg.data);
      int64_t done = 0;
      while (done < seg.size) {
        if (!direct_) {
          const int64_t n = std::min(buffer_bytes_, seg.size - done);
          if (cs) cs->Update(src + done, n);
          CKPT_RETURN_IF_ERROR(Submit(const_cast<char*>(src) + done, n, pos, nullptr));
          pos += n;
          done += n;
          continue;
        }
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

// --- reads --------------------------------------------------------------------------------

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

void SetDirectIoRefusedForTesting(bool refused) { refuse_direct_for_testing = refused; }

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
