// Waiting for a coordinator operation from ckptctl: polls WaitOperation in short slices, so
// that the caller can show progress, until the operation is final or a deadline passes.
#ifndef CKPT_TOOLS_CKPTCTL_OPERATION_WAIT_H_
#define CKPT_TOOLS_CKPTCTL_OPERATION_WAIT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt::ckptctl {

// Polls `operation_id` at `coordinator` (the address, for error messages) with waits of at
// most `slice` until it is done or aborted or `deadline` passes, calling `on_poll` with every
// reply that is not final. Returns the last reply (not final when the deadline passed), or the
// RPC's error naming the coordinator.
absl::StatusOr<pb::OperationStatus> WaitForOperation(
    pb::Coordinator::Stub* stub, const std::string& coordinator, const std::string& operation_id,
    absl::Time deadline, absl::Duration slice,
    const std::function<void(const pb::OperationStatus&)>& on_poll);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_OPERATION_WAIT_H_
