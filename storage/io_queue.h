// A per-thread queue of positional reads/writes with two implementations: io_uring (liburing)
// and plain pread/pwrite executed at submission. Used only by the I/O engine.
#ifndef CKPT_STORAGE_IO_QUEUE_H_
#define CKPT_STORAGE_IO_QUEUE_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/status/statusor.h"

namespace ckpt {

// One positional transfer. `result` is the byte count or -errno once complete.
struct IoOp {
  bool write = false;
  int fd = -1;
  char* buf = nullptr;
  int64_t length = 0;
  int64_t offset = 0;
  int64_t result = 0;
  bool done = false;
  void* user = nullptr;  // caller bookkeeping
};

// Submits ops and returns them as they complete. Not thread-safe: one per thread.
class IoQueue {
 public:
  virtual ~IoQueue() = default;
  virtual absl::Status Submit(IoOp* op) = 0;
  // Blocks until some submitted op completes and returns it (nullptr if none in flight).
  virtual absl::StatusOr<IoOp*> WaitAny() = 0;
  virtual bool is_uring() const = 0;
  int inflight() const { return inflight_; }

 protected:
  int inflight_ = 0;
};

// True when io_uring can be set up in this process (probed once).
bool UringAvailable();

// An io_uring queue of `depth` entries, or an error when io_uring is unavailable.
absl::StatusOr<std::unique_ptr<IoQueue>> MakeUringQueue(int depth);
// A queue that performs each op synchronously with pread/pwrite when submitted.
std::unique_ptr<IoQueue> MakePosixQueue();

// Completes [op.offset + from, op.offset + op.length) synchronously (retrying short transfers
// and EINTR). Returns bytes transferred from `from`; fewer than asked only at end of file.
absl::StatusOr<int64_t> CompleteSync(const IoOp& op, int64_t from);

}  // namespace ckpt

#endif  // CKPT_STORAGE_IO_QUEUE_H_
