#include "tools/ckptctl/operation_wait.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "proto/operation_phase.h"

namespace ckpt::ckptctl {

absl::StatusOr<pb::OperationStatus> WaitForOperation(
    pb::Coordinator::Stub* stub, const std::string& coordinator, const std::string& operation_id,
    absl::Time deadline, absl::Duration slice,
    const std::function<void(const pb::OperationStatus&)>& on_poll) {
  pb::OperationStatus op;
  while (true) {
    grpc::ClientContext context;
    absl::Duration wait = std::min(slice, deadline - absl::Now());
    if (wait < absl::ZeroDuration()) wait = absl::ZeroDuration();
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
    pb::WaitOperationRequest request;
    request.set_operation_id(operation_id);
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    absl::Status s = FromGrpcStatus(stub->WaitOperation(&context, request, &op),
                                    absl::StrCat("WaitOperation at coordinator ", coordinator));
    if (!s.ok()) return s;
    if (IsFinal(op.phase())) return op;
    if (on_poll) on_poll(op);
    if (absl::Now() >= deadline) return op;
  }
}

}  // namespace ckpt::ckptctl
