// absl::Status <-> pb::StatusDetail (proto/coordinator.proto: a code and a message), the form
// in which the coordinator sends one result among others (an aborted operation's diagnosis,
// one join's answer in a JoinOperations call).
#ifndef CKPT_PROTO_STATUS_DETAIL_H_
#define CKPT_PROTO_STATUS_DETAIL_H_

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace ckpt {

pb::StatusDetail ToDetail(const absl::Status& status);
// Code 0 is OK; an unknown code becomes kUnknown, its number kept in the message.
absl::Status FromDetail(const pb::StatusDetail& detail);

}  // namespace ckpt

#endif  // CKPT_PROTO_STATUS_DETAIL_H_
