#include "worker/load_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "exchange/nccl/host_staging_communicator.h"

namespace ckpt::worker {

absl::StatusOr<CommunicatorOptions> LoadCommunicatorOptions(const pb::LoadPlanPart& part,
                                                            const LoadCommunicatorConfig& config,
                                                            const std::string& who) {
  CommunicatorOptions options;
  options.group_name = part.group();
  options.hostname = config.hostname;
  options.gloo_loop_thread_nice = config.gloo_loop_thread_nice;
  if (!part.device_exchange()) {
    options.memory_kind = MemoryKind::kHost;
    return options;
  }
  if (config.cuda_device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the plan asks for the device exchange over NCCL (",
                     part.transport_reason(), ") but this worker serves no GPU"));
  }
  options.memory_kind = MemoryKind::kDevice;
  options.cuda_device = config.cuda_device;
  return options;
}

int CommunicatorRank(const pb::LoadPlanPart& part) {
  return part.group_ranks_size() > 0 ? part.group_rank() : part.rank();
}

std::string LoadTransportName(const pb::LoadPlanPart& part) {
  return part.device_exchange() ? "nccl (device)" : "gloo (host staging)";
}

absl::StatusOr<std::unique_ptr<Communicator>> JoinLoadCommunicator(
    const pb::LoadPlanPart& part, const LoadCommunicatorConfig& config, Store* store,
    const std::string& who) {
  absl::StatusOr<CommunicatorOptions> options = LoadCommunicatorOptions(part, config, who);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(store, CommunicatorRank(part), part.world_size(), *options,
                         absl::Now() + config.rendezvous_timeout);
  if (!comm.ok()) {
    return absl::Status(
        comm.status().code(),
        absl::StrCat(who, ": joining the load's communicator (", LoadTransportName(part),
                     ", group ", part.group(), ", ", part.world_size(), " ranks, rendezvous at ",
                     config.rendezvous_address, "): ", comm.status().message()));
  }
  if ((*comm)->memory_kind() == MemoryKind::kHost) return comm;
  // The exchange algorithms move host buffers: each collective goes through the device.
  return std::unique_ptr<Communicator>(std::make_unique<HostStagingCommunicator>(*std::move(comm)));
}

}  // namespace ckpt::worker
