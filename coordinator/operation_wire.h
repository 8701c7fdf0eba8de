// Conversions between the coordinator's operation types and their wire forms
// (proto/coordinator.proto): kinds, phases, statuses and operation summaries.
#ifndef CKPT_COORDINATOR_OPERATION_WIRE_H_
#define CKPT_COORDINATOR_OPERATION_WIRE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

pb::OperationKind ToProto(OperationKind kind);
// InvalidArgument for OPERATION_KIND_UNSPECIFIED and unknown values.
absl::StatusOr<OperationKind> FromProto(pb::OperationKind kind);
pb::OperationPhase ToProto(Phase phase);
// An operation's summary as GetStatus and WaitOperation return it.
void ToProto(const Operation& op, pb::OperationStatus* out);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPERATION_WIRE_H_
