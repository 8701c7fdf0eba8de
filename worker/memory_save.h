// The worker's side of a memory save (path mem://<name>, pb::SavePlanPart.memory_checkpoint):
// the snapshot's data files are encoded in memory exactly as a storage save would write them
// (worker/memory_tier.h), kept in this worker's memory tier, and copied over the data plane
// to the workers of the part's replica ranks (a header all-to-all, then one all-to-all per file
// straight from and into the tiers' buffers, over the operation's Gloo communicator, made
// through the coordinator's rendezvous as loads do; never over gRPC). The
// rank reports only once its replicas hold their copies, so the coordinator's commit means
// "durable in memory".
#ifndef CKPT_WORKER_MEMORY_SAVE_H_
#define CKPT_WORKER_MEMORY_SAVE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport_security.h"
#include "exchange/communicator_cache.h"
#include "proto/coordinator.pb.h"
#include "worker/memory_gate.h"
#include "worker/memory_tier.h"
#include "worker/save_executor.h"

namespace ckpt::worker {

// Where the replication communicator meets.
struct MemorySaveContext {
  MemoryTier* tier = nullptr;
  std::string rendezvous_address;         // the coordinator's host:port
  TransportSecurity rendezvous_security;  // as the worker's link
  std::string hostname = "127.0.0.1";     // this worker's data-plane address
  int gloo_loop_thread_nice = 10;
  absl::Duration timeout = absl::Minutes(5);  // rendezvous, then the copy
  // Where the replication's communicator is kept after a save that succeeded, for the next
  // memory save over the same ranks (worker/load_communicator.h: JoinOrReuseLoadCommunicator).
  // Null: the worker's SharedCommunicators() (itself null when the worker keeps none).
  CommunicatorCache* communicators = nullptr;
};

// Keeps `snapshot`'s files under part.memory_checkpoint() in context.tier, exchanges copies
// with the other ranks of the operation (every rank of the save runs this at the same time)
// and seals the checkpoint here. Returns the rank's written record (serialized pb::Manifest
// of its pieces and files, as WriteSnapshot returns). Errors name the rank, job, checkpoint
// and (budget) worker and bytes; on error nothing of this save stays in the tier. Logs
// memory_save_kept with the time of each step (encode, rendezvous, replicate) and whether the
// communicator of an earlier save was reused.
absl::StatusOr<std::string> KeepSnapshotInMemory(const pb::SavePlanPart& part,
                                                 const std::string& operation_id,
                                                 const SaveSnapshot& snapshot,
                                                 const MemorySaveContext& context,
                                                 const MemoryGate& gate);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MEMORY_SAVE_H_
