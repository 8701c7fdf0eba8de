#include "common/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {

// gRPC and Abseil share the canonical code numbering (0..16), so codes map one to one.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code < 0 || code > 16) code = static_cast<int>(absl::StatusCode::kUnknown);
  std::string message = context.empty() ? status.error_message()
                                        : absl::StrCat(context, ": ", status.error_message());
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  if (code < 0 || code > 16) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

}  // namespace ckpt
