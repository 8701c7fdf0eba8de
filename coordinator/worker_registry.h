// Worker daemons known to the coordinator, with leases: a worker registers, then renews its
// lease with heartbeats; one whose lease runs out is declared dead (and reported once by
// Tick, so the service can abort the operations that depended on it).
//
// Pure: no gRPC, threads or logging; time comes from the injected Clock. Not thread-safe.
#ifndef CKPT_COORDINATOR_WORKER_REGISTRY_H_
#define CKPT_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "proto/types.pb.h"

namespace ckpt::coordinator {

// What a worker announces about itself when it registers.
struct WorkerDescription {
  std::string host;
  int64_t pid = 0;
  std::string data_plane_address;  // host:port of its data plane
  std::vector<pb::MemoryKind> memory_kinds;
  int local_rank = 0;
  int gpu = -1;       // -1 when none
  bool nccl = false;  // can create an NCCL communicator on `gpu`
};

// A registered worker and its lease.
struct WorkerRecord {
  std::string id;  // "w-<incarnation>-<n>" ("w-<n>" without an incarnation)
  WorkerDescription description;
  absl::Time registered;
  absl::Time last_heartbeat;
  absl::Time lease_expiry;
  bool alive = true;
  std::string death_cause;  // set when !alive, e.g. "missed its lease (last heartbeat 3s ago)"

  // "worker w-2 (host h, pid 123)".
  std::string DebugString() const;
};

// The registry. See the file comment.
class WorkerRegistry {
 public:
  // `lease`: how long a registration or heartbeat keeps a worker alive.
  // `dead_retention`: how long dead workers stay listed (for status) before they are forgotten;
  // `max_dead`: at most this many dead workers stay listed (the longest dead go first), so
  // workers that register and die cannot grow the registry without bound.
  // `incarnation`: the coordinator process's incarnation (hex), part of every id handed out,
  // so that an id of an earlier coordinator process is never taken for one of this one's.
  WorkerRegistry(const Clock* clock, absl::Duration lease,
                 absl::Duration dead_retention = absl::Hours(1), std::string incarnation = "",
                 int64_t max_dead = 1024);

  absl::Duration lease() const { return lease_; }

  // Registers a worker and returns its record. A worker that registers again with the same
  // host and pid (it reconnected, e.g. after a coordinator restart or network loss) keeps
  // its id and is alive again. InvalidArgument when host is empty or pid is not positive.
  absl::StatusOr<WorkerRecord> Register(const WorkerDescription& description);

  // Renews the lease. NotFound for an unknown id (also one of another incarnation: the
  // coordinator restarted); FailedPrecondition for a worker already declared dead (it must
  // register again, and whatever depended on it was aborted).
  absl::Status Heartbeat(absl::string_view worker_id);

  // A worker that shuts down cleanly leaves the registry at once.
  absl::Status Deregister(absl::string_view worker_id);

  // Declares dead every live worker whose lease expired at the clock's current time, `grace`
  // (the coordinator's own heartbeat lag, coordinator/lease_book.h) allowed for, and returns
  // them (each reported once); forgets workers dead for longer than dead_retention, and the
  // longest dead past max_dead.
  std::vector<WorkerRecord> Tick(absl::Duration grace = absl::ZeroDuration());

  // nullptr for an unknown id (or one of another incarnation).
  const WorkerRecord* Find(absl::string_view worker_id) const;
  // The worker Register would give `description`'s id again (same host and pid); nullptr when
  // it would register a new one.
  const WorkerRecord* FindRegistered(const WorkerDescription& description) const;
  // All workers, live and recently dead, in registration order.
  std::vector<const WorkerRecord*> All() const;
  int LiveCount() const;
  int64_t DeadCount() const { return dead_; }
  size_t Size() const { return workers_.size(); }  // live and listed dead

 private:
  // Forgets the `n` workers dead longest.
  void ForgetLongestDead(int64_t n);
  // The number in an id of this registry's form; 0 (never an id) otherwise.
  uint64_t WorkerNumber(absl::string_view id) const;

  const Clock* clock_;
  absl::Duration lease_;
  absl::Duration dead_retention_;
  std::string incarnation_;
  int64_t max_dead_;
  int64_t dead_ = 0;                          // workers listed dead
  std::map<uint64_t, WorkerRecord> workers_;  // by number, i.e. registration order
  uint64_t next_id_ = 1;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_WORKER_REGISTRY_H_
