// What an operation's phase on the wire means to the programs that read OperationStatus and
// WaitResponse (workers, the client, ckptctl, the load generator, tests): one definition of
// an operation that has ended, named as the coordinator's state machine names it for its
// internal phases (IsFinal of coordinator/job_state.h).
#ifndef CKPT_PROTO_OPERATION_PHASE_H_
#define CKPT_PROTO_OPERATION_PHASE_H_

#include "proto/types.pb.h"

namespace ckpt {

// Whether an operation in `phase` has ended: done or aborted (nothing about it changes after).
inline bool IsFinal(pb::OperationPhase phase) {
  return phase == pb::PHASE_DONE || phase == pb::PHASE_ABORTED;
}

}  // namespace ckpt

#endif  // CKPT_PROTO_OPERATION_PHASE_H_
