#include "storage/io_queue.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "storage/file_util.h"

namespace ckpt {
namespace {

class PosixQueue : public IoQueue {
 public:
  absl::Status Submit(IoOp* op) override {
    auto n = CompleteSync(*op, 0);
    op->result = n.ok() ? *n : -EIO;
    if (!n.ok()) last_error_ = n.status();
    completed_.push_back(op);
    ++inflight_;
    return absl::OkStatus();
  }
  absl::StatusOr<IoOp*> WaitAny() override {
    if (completed_.empty()) return nullptr;
    IoOp* op = completed_.front();
    completed_.pop_front();
    --inflight_;
    if (op->result == -EIO && !last_error_.ok()) {
      absl::Status s = last_error_;
      last_error_ = absl::OkStatus();
      return s;
    }
    return op;
  }
  bool is_uring() const override { return false; }

 private:
  std::deque<IoOp*> completed_;
  absl::Status last_error_;
};

class UringQueue : public IoQueue {
 public:
  ~UringQueue() override {
    // Never leave the kernel writing into buffers we are about to free.
    while (inflight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) != 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --inflight_;
    }
    io_uring_queue_exit(&ring_);
  }
  absl::Status Init(int depth) {
    int rc = io_uring_queue_init(static_cast<unsigned>(depth), &ring_, 0);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
    return absl::OkStatus();
  }
  absl::Status Submit(IoOp* op) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return absl::ResourceExhaustedError("io_uring submission queue is full");
    if (op->write) {
      io_uring_prep_write(sqe, op->fd, op->buf, static_cast<unsigned>(op->length),
                          static_cast<__u64>(op->offset));
    } else {
      io_uring_prep_read(sqe, op->fd, op->buf, static_cast<unsigned>(op->length),
                         static_cast<__u64>(op->offset));
    }
    io_uring_sqe_set_data(sqe, op);
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_submit");
    ++inflight_;
    return absl::OkStatus();
  }
  absl::StatusOr<IoOp*> WaitAny() override {
    if (inflight_ == 0) return nullptr;
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_wait_cqe");
    auto* op = static_cast<IoOp*>(io_uring_cqe_get_data(cqe));
    op->result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --inflight_;
    return op;
  }
  bool is_uring() const override { return true; }

 private:
  io_uring ring_;
};

}  // namespace

bool UringAvailable() {
  static const bool available = [] {
    io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) < 0) return false;
    io_uring_queue_exit(&ring);
    return true;
  }();
  return available;
}

absl::StatusOr<std::unique_ptr<IoQueue>> MakeUringQueue(int depth) {
  auto q = std::make_unique<UringQueue>();
  absl::Status s = q->Init(depth);
  if (!s.ok()) return s;
  return std::unique_ptr<IoQueue>(std::move(q));
}

std::unique_ptr<IoQueue> MakePosixQueue() { return std::make_unique<PosixQueue>(); }

absl::StatusOr<int64_t> CompleteSync(const IoOp& op, int64_t from) {
  int64_t done = from;
  while (done < op.length) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(op.length - done, 1 << 30));
    ssize_t n = op.write ? ::pwrite(op.fd, op.buf + done, want, op.offset + done)
                         : ::pread(op.fd, op.buf + done, want, op.offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, op.write ? "pwrite" : "pread");
    }
    if (n == 0) {
      if (op.write) return absl::InternalError("pwrite wrote 0 bytes");
      break;  // end of file
    }
    done += n;
  }
  return done - from;
}

}  // namespace ckpt
