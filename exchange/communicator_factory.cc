#include "exchange/communicator_factory.h"

#include "exchange/gloo/gloo_communicator.h"
#include "exchange/nccl/nccl_communicator.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Store* store, int rank, int size,
                                                                 const CommunicatorOptions& options,
                                                                 absl::Time deadline) {
  if (options.memory_kind == MemoryKind::kDevice) {
    NcclOptions nccl;
    nccl.group_name = options.group_name;
    nccl.cuda_device = options.cuda_device;
    return CreateNcclCommunicator(store, rank, size, nccl, deadline);
  }
  GlooOptions gloo;
  gloo.group_name = options.group_name;
  gloo.hostname = options.hostname;
  gloo.loop_thread_nice = options.gloo_loop_thread_nice;
  return CreateGlooCommunicator(store, rank, size, gloo, deadline);
}

}  // namespace ckpt
