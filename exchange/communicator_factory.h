// Picks the data-plane backend by memory kind: device memory -> NCCL, host memory -> Gloo.
#ifndef CKPT_EXCHANGE_COMMUNICATOR_FACTORY_H_
#define CKPT_EXCHANGE_COMMUNICATOR_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "rendezvous/store.h"

namespace ckpt {

// Everything needed to join a group, for either backend.
struct CommunicatorOptions {
  MemoryKind memory_kind = MemoryKind::kHost;
  // Store key prefix, unique per group instance.
  std::string group_name = "group";
  // Gloo: the address this rank binds to and advertises.
  std::string hostname = "127.0.0.1";
  // Gloo: added to the nice value of the TCP event-loop thread (GlooOptions::loop_thread_nice).
  int gloo_loop_thread_nice = 10;
  // NCCL: the CUDA device ordinal (-1 = current).
  int cuda_device = -1;
};

// Joins the group with the backend for options.memory_kind.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Store* store, int rank, int size,
                                                                 const CommunicatorOptions& options,
                                                                 absl::Time deadline);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_COMMUNICATOR_FACTORY_H_
