// The bounds of every string, list and count a caller sends the coordinator (issue 39): each
// RPC handler checks its request here first, before anything of it is stored or logged, and
// answers InvalidArgument naming the call, the field, its size and the bound. docs/services.md
// ("Request bounds") lists them.
//
// Text fields that are logged or shown by ckptctl (host names, addresses, ids, job and
// checkpoint names) must also hold no control characters, so that a request cannot forge log
// lines. Bytes fields that carry serialized messages (a save's written manifest, a memory
// record's manifest) are bounded by the server's receive limit alone: they are parsed, never
// logged.
//
// Pure: no gRPC, threads or logging.
#ifndef CKPT_COORDINATOR_REQUEST_BOUNDS_H_
#define CKPT_COORDINATOR_REQUEST_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

// Strings.
inline constexpr size_t kMaxHostBytes = 255;                // WorkerInfo.host (RFC 1035: 253)
inline constexpr size_t kMaxAddressBytes = 512;             // WorkerInfo.data_plane_address
inline constexpr size_t kMaxIdBytes = 256;                  // worker, operation and persist ids
inline constexpr size_t kMaxJobNameBytes = 256;             // job names
inline constexpr size_t kMaxNameBytes = 1024;               // memory checkpoint names, file names
inline constexpr size_t kMaxPathBytes = 4096;               // checkpoint paths (PATH_MAX)
inline constexpr size_t kMaxMessageTextBytes = 64 << 10;    // StatusDetail.message, outcomes
inline constexpr size_t kMaxDigestBytes = 64;               // state digests (SHA-256: 32)
inline constexpr size_t kMaxProcessGroupsBytes = 16 << 20;  // process group spec text
inline constexpr size_t kMaxLayoutJsonBytes = 64 << 20;     // StartReshard's target layout
inline constexpr size_t kMaxTensorKeyBytes = 4096;          // a tensor's key in a RankState
inline constexpr size_t kMaxMetadataKeyBytes = 256;         // JoinOperation metadata
inline constexpr size_t kMaxMetadataValueBytes = 64 << 10;
inline constexpr size_t kMaxPageTokenBytes = 64;  // GetStatusRequest.page_token
// Counts.
inline constexpr int64_t kMaxWorldSize = 1 << 20;  // ranks of a job (ranks: [0, world size))
inline constexpr int kMaxMemoryKinds = 16;         // WorkerInfo.memory_kinds
inline constexpr int kMaxHeldCheckpoints = 4096;   // RegisterWorkerRequest.memory_held
inline constexpr int kMaxFilesPerList = 1 << 20;   // held files, persist report files
inline constexpr int kMaxEvictedPerHeartbeat = 4096;
inline constexpr int kMaxMetadataEntries = 1024;
inline constexpr int kMaxJoinsPerCall = 4096;      // JoinOperationsRequest.joins
inline constexpr int kMaxPiecesPerRank = 1 << 20;  // shards plus compact tensors of a rank
inline constexpr int kMaxDims = 64;                // shapes, regions, replica ids, meshes
inline constexpr int kMaxStatusPageItems = 1000;   // GetStatus entries per page (and default)
inline constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;  // any *_ms a caller sets

// At most `keep` bytes of `value` for a log line or message, C-escaped, with "...(N bytes)"
// appended when it was cut: never log a caller's string whole.
std::string LogPrefix(absl::string_view value, size_t keep = 64);

// Each returns OK or InvalidArgument naming the call, the field (with its index), its size
// and the bound.
absl::Status CheckRegisterWorker(const pb::RegisterWorkerRequest& request);
absl::Status CheckHeartbeat(const pb::HeartbeatRequest& request);
absl::Status CheckDeregisterWorker(const pb::DeregisterWorkerRequest& request);
absl::Status CheckAttachRank(const pb::AttachRankRequest& request);
absl::Status CheckDetachRank(const pb::DetachRankRequest& request);
// One join (JoinOperation, or each join of a JoinOperations call).
absl::Status CheckJoinOperation(const pb::JoinOperationRequest& request);
// The call as a whole: the number of joins (each join is checked on its own).
absl::Status CheckJoinOperations(const pb::JoinOperationsRequest& request);
absl::Status CheckWatchWork(const pb::WatchWorkRequest& request);
absl::Status CheckReportProgress(const pb::ReportProgressRequest& request);
absl::Status CheckReportResult(const pb::ReportResultRequest& request);
absl::Status CheckWaitOperation(const pb::WaitOperationRequest& request);
absl::Status CheckRequestOperation(const pb::RequestOperationRequest& request);
absl::Status CheckPendingOperation(const pb::PendingOperationRequest& request);
absl::Status CheckGetStatus(const pb::GetStatusRequest& request);
absl::Status CheckStartReshard(const pb::StartReshardRequest& request);
absl::Status CheckPersistReport(const pb::PersistReportRequest& request);

// Where a GetStatus page starts: a section (workers, jobs, operations, memory checkpoints,
// published names, in that order), an entry of it, and an item within that entry (a job's
// ranks, a memory checkpoint's replicas) when one entry spans pages.
struct StatusCursor {
  int section = 0;
  int64_t entry = 0;
  int64_t item = 0;
};
inline constexpr int kStatusSections = 5;
// "" for the first page; otherwise "<section>.<entry>.<item>".
std::string FormatStatusPageToken(const StatusCursor& cursor);
// InvalidArgument for a token this coordinator never handed out.
absl::StatusOr<StatusCursor> ParseStatusPageToken(absl::string_view token);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REQUEST_BOUNDS_H_
