// Device-memory Communicator over NCCL: one CUDA stream per communicator, non-blocking NCCL
// communicator so that a stalled or failed peer becomes a Status (after ncclCommAbort) at the
// deadline instead of a hang. The unique id travels through the rendezvous Store.
// NCCL has no message tags: Send/Recv ignore `tag` and match by order per peer. A collective's
// failure cannot always be pinned on one peer; messages then say "a peer".
#ifndef CKPT_EXCHANGE_NCCL_NCCL_COMMUNICATOR_H_
#define CKPT_EXCHANGE_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "rendezvous/store.h"

namespace ckpt {

// How an NCCL group forms.
struct NcclOptions {
  // Store key prefix; unique per group instance (rendezvous keys stay in the store).
  std::string group_name = "nccl";
  // CUDA device ordinal to use; -1 keeps the calling thread's current device.
  int cuda_device = -1;
};

// The NCCL library's version (ncclGetVersion, e.g. 22703 for 2.27.3): whether this process
// can create NCCL communicators at all (the worker advertises "nccl" on it).
absl::StatusOr<int> NcclVersion();

// Joins the group. FailedPrecondition "no CUDA device: ..." on machines without a GPU;
// DeadlineExceeded naming ranks that never arrived.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store* store, int rank,
                                                                     int size,
                                                                     const NcclOptions& options,
                                                                     absl::Time deadline);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_NCCL_NCCL_COMMUNICATOR_H_
