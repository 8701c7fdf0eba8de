#include "coordinator/operation_wire.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "proto/status_detail.h"

namespace ckpt::coordinator {
namespace {

int64_t UnixMs(absl::Time t) {
  if (t == absl::InfiniteFuture() || t == absl::InfinitePast()) return 0;
  return absl::ToUnixMillis(t);
}

}  // namespace

pb::OperationKind ToProto(OperationKind kind) {
  switch (kind) {
    case OperationKind::kSave:
      return pb::OPERATION_SAVE;
    case OperationKind::kLoad:
      return pb::OPERATION_LOAD;
    case OperationKind::kReshard:
      return pb::OPERATION_RESHARD;
  }
  return pb::OPERATION_KIND_UNSPECIFIED;
}

absl::StatusOr<OperationKind> FromProto(pb::OperationKind kind) {
  switch (kind) {
    case pb::OPERATION_SAVE:
      return OperationKind::kSave;
    case pb::OPERATION_LOAD:
      return OperationKind::kLoad;
    case pb::OPERATION_RESHARD:
      return OperationKind::kReshard;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("operation kind ", static_cast<int>(kind), " is not save, load or reshard"));
  }
}

pb::OperationPhase ToProto(Phase phase) {
  switch (phase) {
    case Phase::kGathering:
      return pb::PHASE_GATHERING;
    case Phase::kPlanning:
      return pb::PHASE_PLANNING;
    case Phase::kExecuting:
      return pb::PHASE_EXECUTING;
    case Phase::kCommitting:
      return pb::PHASE_COMMITTING;
    case Phase::kDone:
      return pb::PHASE_DONE;
    case Phase::kAborted:
      return pb::PHASE_ABORTED;
  }
  return pb::PHASE_UNSPECIFIED;
}

void ToProto(const Operation& op, pb::OperationStatus* out) {
  out->set_id(op.id);
  out->set_job(op.job);
  out->set_kind(ToProto(op.kind));
  out->set_path(op.path);
  out->set_requested_by(op.requested_by);
  out->set_world_size(op.world_size);
  out->set_phase(ToProto(op.phase));
  out->set_joined_ranks(op.JoinedRanks());
  out->set_reported_ranks(op.ReportedRanks());
  out->set_bytes_done(op.BytesDone());
  out->set_bytes_total(op.BytesTotal());
  out->set_bytes_read(op.BytesRead());
  out->set_ranks_described_by_digest(op.ranks_described_by_digest);
  out->set_process_groups(op.process_groups);
  *out->mutable_status() = ToDetail(op.status);
  out->set_created_unix_ms(UnixMs(op.created));
  out->set_deadline_unix_ms(UnixMs(op.deadline));
  out->set_transfer_plan_reused(op.plan_reused);
  out->set_transfer_serving_ranks(op.serving_ranks);
  out->set_received_version(op.received_version);
}

}  // namespace ckpt::coordinator
