// The one place where gRPC status codes convert to and from absl::Status.
#ifndef CKPT_COMMON_GRPC_STATUS_H_
#define CKPT_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// Converts a gRPC status (code and message kept; details dropped). `context`, when non-empty,
// is prefixed to the message, e.g. "Rendezvous.Get to 127.0.0.1:5000".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context = "");

// Converts an absl::Status for returning from a gRPC service method.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace ckpt

#endif  // CKPT_COMMON_GRPC_STATUS_H_
