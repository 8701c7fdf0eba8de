// Fuzz target for the coordinator's request bounds (coordinator/request_bounds.h): the first
// byte picks a request type, the rest is parsed as that message (as gRPC would parse it off
// the wire) and checked. Every input must be answered with OK or an InvalidArgument whose
// message stays short (a refusal never carries a caller's value whole); a page token must
// parse back to itself. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "coordinator/request_bounds.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {
namespace {

template <typename Message>
absl::Status Check(const uint8_t* data, size_t size, absl::Status (*check)(const Message&)) {
  Message message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return absl::OkStatus();
  return check(message);
}

absl::Status Dispatch(uint8_t which, const uint8_t* data, size_t size) {
  switch (which % 16) {
    case 0:
      return Check<pb::RegisterWorkerRequest>(data, size, &CheckRegisterWorker);
    case 1:
      return Check<pb::HeartbeatRequest>(data, size, &CheckHeartbeat);
    case 2:
      return Check<pb::DeregisterWorkerRequest>(data, size, &CheckDeregisterWorker);
    case 3:
      return Check<pb::AttachRankRequest>(data, size, &CheckAttachRank);
    case 4:
      return Check<pb::DetachRankRequest>(data, size, &CheckDetachRank);
    case 5:
      return Check<pb::JoinOperationRequest>(data, size, &CheckJoinOperation);
    case 6:
      return Check<pb::JoinOperationsRequest>(data, size, &CheckJoinOperations);
    case 7:
      return Check<pb::WatchWorkRequest>(data, size, &CheckWatchWork);
    case 8:
      return Check<pb::ReportProgressRequest>(data, size, &CheckReportProgress);
    case 9:
      return Check<pb::ReportResultRequest>(data, size, &CheckReportResult);
    case 10:
      return Check<pb::WaitOperationRequest>(data, size, &CheckWaitOperation);
    case 11:
      return Check<pb::RequestOperationRequest>(data, size, &CheckRequestOperation);
    case 12:
      return Check<pb::PendingOperationRequest>(data, size, &CheckPendingOperation);
    case 13:
      return Check<pb::GetStatusRequest>(data, size, &CheckGetStatus);
    case 14:
      return Check<pb::StartReshardRequest>(data, size, &CheckStartReshard);
    default:
      return Check<pb::PersistReportRequest>(data, size, &CheckPersistReport);
  }
}

void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "request_bounds_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace
}  // namespace ckpt::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::coordinator;  // NOLINT(build/namespaces)
  // Protobuf logs every string field that is not UTF-8 (most mutations): not what is tested.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const absl::Status s = Dispatch(data[0], data + 1, size - 1);
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) {
    Fail("a check answered neither OK nor InvalidArgument", s.ToString());
  }
  if (s.message().size() > 1024)
    Fail("a refusal's message is over 1 KiB", s.ToString().substr(0, 200));
  // The same bytes as a page token: parsed, it formats back to what was parsed.
  const std::string token(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<StatusCursor> cursor = ParseStatusPageToken(token);
  if (cursor.ok()) {
    absl::StatusOr<StatusCursor> again = ParseStatusPageToken(FormatStatusPageToken(*cursor));
    if (!again.ok() || again->section != cursor->section || again->entry != cursor->entry ||
        again->item != cursor->item) {
      Fail("a page token does not round-trip", token.substr(0, 64));
    }
  }
  return 0;
}
