#include "exchange/exchange.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

const std::vector<std::string>& ExchangeAlgorithmNames() {
  static const auto* names = new std::vector<std::string>{"broadcast", "gather_rounds",
                                                          "gather_object", "overlap_all_to_all"};
  return *names;
}

absl::StatusOr<ShardBuffers> ExchangeByDistribution(absl::string_view algorithm, Communicator& comm,
                                                    const ExchangePlan& plan,
                                                    const ShardBuffers& loaded,
                                                    const ExchangeOptions& options,
                                                    ExchangeReport* report) {
  if (options.memory_budget_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("exchange memory budget must be positive, got ", options.memory_budget_bytes));
  }
  if (comm.memory_kind() != MemoryKind::kHost) {
    return absl::FailedPreconditionError(
        absl::StrCat("exchange algorithms move host buffers but the communicator (",
                     comm.backend_name(), ") works on ", MemoryKindName(comm.memory_kind()),
                     " memory; use a host-memory (Gloo) communicator or wrap it in "
                     "HostStagingCommunicator"));
  }
  if (algorithm == "broadcast") return ExchangeBroadcast(comm, plan, loaded, options, report);
  if (algorithm == "gather_rounds") {
    return ExchangeGatherRounds(comm, plan, loaded, options, report);
  }
  if (algorithm == "gather_object") {
    return ExchangeGatherObject(comm, plan, loaded, options, report);
  }
  if (algorithm == "overlap_all_to_all") {
    return ExchangeOverlapAllToAll(comm, plan, loaded, options, report);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown exchange algorithm '", algorithm,
                   "'; valid: ", absl::StrJoin(ExchangeAlgorithmNames(), ", ")));
}

}  // namespace ckpt
