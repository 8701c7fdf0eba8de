// What a worker knows of its operations' ends from the coordinator's work stream. The
// coordinator writes an `ended` item (the final status) on a worker's WatchWork stream for every
// operation that ends while the stream is open and in which the worker has a joined rank, and
// marks each stream's first message `stream_opened`. So a rank that joined with a call sent
// while stream S was open learns the end on S, and while S stays open the worker needs no
// WaitOperation call to know that the operation has not ended: its trainers' waits hold no call
// at the coordinator (12,800 long polls at 100,000 ranks; issue 16). Once S closes, an end may
// be missed, and waiters ask the coordinator again.
#ifndef CKPT_WORKER_OPERATION_ENDS_H_
#define CKPT_WORKER_OPERATION_ENDS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// Thread-safe. Streams are numbered from 1 in the order they open; 0 is "none".
class OperationEnds {
 public:
  // How a wait ended.
  enum class Outcome {
    kEnded,       // the operation's end is known (the status was filled in)
    kNotWatched,  // no open stream will bring it: ask the coordinator
    kNotEndedBy,  // the deadline passed; the open stream would have brought the end
  };

  // At most this many operations are remembered, joined and ended each (the oldest go).
  static constexpr size_t kRemembered = 4096;

  // A work stream delivered its first message (`stream_opened`).
  void StreamOpened();
  // That stream ended: ends may be missed until the next one opens.
  void StreamClosed();
  // The open stream's number; 0 while none is open.
  uint64_t OpenStream() const;

  // A rank of this worker joined `operation_id` in a call sent while stream `stream` was open
  // (OpenStream() read before the call; 0 records nothing).
  void Joined(const std::string& operation_id, uint64_t stream);
  // The coordinator says operation `status.id()` ended with `status`: on the work stream
  // (`from_stream`) or in a join's answer.
  void Ended(const pb::OperationStatus& status, bool from_stream = true);

  // How many ends were recorded with `from_stream` (for the worker's status).
  int64_t ends_from_stream() const;

  // Whether the operation is known not to have ended: a rank joined it while the stream open
  // now was, and that stream has brought no end for it.
  bool KnownOngoing(const std::string& operation_id) const;
  // Blocks until the operation's end is known (kEnded, `*status` filled in), no open stream
  // watches it (kNotWatched, at once when none does) or `deadline` passes (kNotEndedBy).
  Outcome Wait(const std::string& operation_id, absl::Time deadline, pb::OperationStatus* status);

 private:
  bool WatchedLocked(const std::string& operation_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // std::mutex, not absl::Mutex: Debian's Abseil is not instrumented, so ThreadSanitizer
  // would not see an absl::Mutex order its accesses (tests tagged tsan).
  mutable std::mutex mu_;
  std::condition_variable changed_;                // a stream opened or closed, or an end arrived
  uint64_t streams_ ABSL_GUARDED_BY(mu_) = 0;      // streams opened so far
  uint64_t open_stream_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none open
  int64_t ends_from_stream_ ABSL_GUARDED_BY(mu_) = 0;
  // Operation -> the stream open when a rank of this worker joined it; oldest first in order.
  absl::flat_hash_map<std::string, uint64_t> joined_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> joined_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, pb::OperationStatus> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_OPERATION_ENDS_H_
