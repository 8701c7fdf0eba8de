// The communicator of one exchange-based load part, created per operation group through the
// coordinator's rendezvous: Gloo over TCP from host staging, or NCCL on the device when the
// coordinator chose the device exchange (pb::LoadPlanPart::device_exchange, decided by
// coordinator/load_exchange's ChooseExchangeTransport). The exchange algorithms stay written
// against `Communicator` only: the NCCL communicator is presented to them as a host one
// (exchange/nccl/host_staging_communicator.h), so their buffers stay in host memory and each
// collective stages through the device.
#ifndef CKPT_WORKER_LOAD_COMMUNICATOR_H_
#define CKPT_WORKER_LOAD_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "exchange/communicator_factory.h"
#include "proto/coordinator.pb.h"
#include "rendezvous/store.h"

namespace ckpt::worker {

// What the worker brings to a load's communicator.
struct LoadCommunicatorConfig {
  std::string hostname = "127.0.0.1";  // Gloo binds here
  int gloo_loop_thread_nice = 10;
  int cuda_device = -1;            // the GPU this worker serves (-1: none)
  std::string rendezvous_address;  // for messages
  absl::Duration rendezvous_timeout = absl::Minutes(2);
};

// The factory options for `part`: host memory (Gloo) unless part.device_exchange(), then
// device memory (NCCL) on config.cuda_device. The group is part.group(). FailedPrecondition
// naming `who` when the plan asks for the device exchange of a worker that serves no GPU (the
// coordinator and the worker disagree about it).
absl::StatusOr<CommunicatorOptions> LoadCommunicatorOptions(const pb::LoadPlanPart& part,
                                                            const LoadCommunicatorConfig& config,
                                                            const std::string& who);

// Joins `part`'s group through `store` with LoadCommunicatorOptions, on the calling thread
// (which then uses the communicator: NCCL's device is made current on it). Returns a
// host-memory communicator either way. Errors name `who`, the group, the world, the transport
// and the rendezvous address.
absl::StatusOr<std::unique_ptr<Communicator>> JoinLoadCommunicator(
    const pb::LoadPlanPart& part, const LoadCommunicatorConfig& config, Store* store,
    const std::string& who);

// This rank's number in `part`'s communicator: its group rank when the load runs in several
// process groups (LoadPlanPart.group_ranks set), else its rank.
int CommunicatorRank(const pb::LoadPlanPart& part);

// "nccl (device)" or "gloo (host staging)", for logs.
std::string LoadTransportName(const pb::LoadPlanPart& part);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_COMMUNICATOR_H_
