#include "exchange/exchange.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "exchange/exchange_internal.h"

namespace ckpt {

const std::vector<std::string>& ExchangeAlgorithmNames() {
  static const auto* names = new std::vector<std::string>{"broadcast", "gather_rounds",
                                                          "gather_object", "overlap_all_to_all"};
  return *names;
}

namespace {

absl::Status CheckCommunicator(const Communicator& comm, const ExchangeOptions& options) {
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
  return absl::OkStatus();
}

// The Into form of the named algorithm; InvalidArgument listing the valid names.
absl::StatusOr<exchange_internal::IntoAlgorithm> FindAlgorithm(absl::string_view algorithm) {
  if (algorithm == "broadcast") return ExchangeBroadcastInto;
  if (algorithm == "gather_rounds") return ExchangeGatherRoundsInto;
  if (algorithm == "gather_object") return ExchangeGatherObjectInto;
  if (algorithm == "overlap_all_to_all") return ExchangeOverlapAllToAllInto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown exchange algorithm '", algorithm,
                   "'; valid: ", absl::StrJoin(ExchangeAlgorithmNames(), ", ")));
}

}  // namespace

absl::StatusOr<ShardBuffers> ExchangeByDistribution(absl::string_view algorithm, Communicator& comm,
                                                    const ExchangePlan& plan,
                                                    const ShardBuffers& loaded,
                                                    const ExchangeOptions& options,
                                                    ExchangeReport* report) {
  CKPT_RETURN_IF_ERROR(CheckCommunicator(comm, options));
  CKPT_ASSIGN_OR_RETURN(exchange_internal::IntoAlgorithm into, FindAlgorithm(algorithm));
  return exchange_internal::RunAllocating(into, comm, plan, loaded, options, report);
}

absl::Status ExchangeByDistributionInto(absl::string_view algorithm, Communicator& comm,
                                        const ExchangePlan& plan, const ShardBuffers& loaded,
                                        const DestinationBuffers& destinations,
                                        const ExchangeOptions& options, ExchangeReport* report) {
  CKPT_RETURN_IF_ERROR(CheckCommunicator(comm, options));
  CKPT_ASSIGN_OR_RETURN(exchange_internal::IntoAlgorithm into, FindAlgorithm(algorithm));
  return into(comm, plan, loaded, destinations, options, report);
}

}  // namespace ckpt
