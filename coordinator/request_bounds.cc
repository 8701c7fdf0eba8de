#include "coordinator/request_bounds.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::coordinator {
namespace {

// Whether `value` holds a control character (a forged log line, a terminal escape).
bool HasControl(absl::string_view value) {
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

// A field's name, with its index when it is an element of a list: "memory_held[3].name".
std::string Field(absl::string_view field, int index = -1, absl::string_view sub = "") {
  if (index < 0) return std::string(field);
  return absl::StrCat(field, "[", index, "]", sub.empty() ? "" : ".", sub);
}

// The checks of one request, in order; the first failure is kept. Fast on the common path:
// a field's name is built only when it fails.
class Checker {
 public:
  explicit Checker(absl::string_view call) : call_(call) {}

  // A string of at most `bound` bytes; `plain`: also without control characters.
  template <typename Name>
  Checker& TextAt(const Name& name, absl::string_view value, size_t bound, bool plain = true) {
    if (!status_.ok()) return *this;
    if (value.size() > bound) {
      Fail(absl::StrCat(name(), " is ", value.size(), " bytes, over the bound of ", bound,
                        " (starts \"", LogPrefix(value, 32), "\")"));
    } else if (plain && HasControl(value)) {
      Fail(absl::StrCat(name(), " \"", LogPrefix(value), "\" holds a control character"));
    }
    return *this;
  }
  Checker& Text(absl::string_view name, absl::string_view value, size_t bound, bool plain = true) {
    return TextAt([name] { return std::string(name); }, value, bound, plain);
  }
  // A list of at most `bound` elements.
  Checker& Count(absl::string_view name, int64_t count, int64_t bound) {
    if (status_.ok() && count > bound) {
      Fail(absl::StrCat(name, " has ", count, " entries, over the bound of ", bound));
    }
    return *this;
  }
  // A number in [lo, hi].
  Checker& Range(absl::string_view name, int64_t value, int64_t lo, int64_t hi) {
    if (status_.ok() && (value < lo || value > hi)) {
      Fail(absl::StrCat(name, " is ", value, ", outside the bound [", lo, ", ", hi, "]"));
    }
    return *this;
  }
  bool ok() const { return status_.ok(); }
  absl::Status status() const { return status_; }

 private:
  void Fail(const std::string& what) {
    status_ = absl::InvalidArgumentError(absl::StrCat(call_, ": ", what));
  }

  absl::string_view call_;
  absl::Status status_;
};

void CheckHeld(Checker& c, const pb::HeldMemoryCheckpoint& held, int i) {
  c.TextAt([i] { return Field("memory_held", i, "name"); }, held.name(), kMaxNameBytes)
      .Count(Field("memory_held", i, "files"), held.files_size(), kMaxFilesPerList)
      .TextAt([i] { return Field("memory_held", i, "persist_outcome"); }, held.persist_outcome(),
              kMaxMessageTextBytes, /*plain=*/false);
  for (int f = 0; c.ok() && f < held.files_size(); ++f) {
    c.TextAt([i, f] { return absl::StrCat(Field("memory_held", i, "files"), "[", f, "]"); },
             held.files(f), kMaxNameBytes);
  }
  const pb::MemoryCheckpointRecord& r = held.record();
  c.TextAt([i] { return Field("memory_held", i, "record.name"); }, r.name(), kMaxNameBytes)
      .TextAt([i] { return Field("memory_held", i, "record.published_name"); }, r.published_name(),
              kMaxNameBytes)
      .TextAt([i] { return Field("memory_held", i, "record.persist_to"); }, r.persist_to(),
              kMaxPathBytes);
}

void CheckPiece(Checker& c, const pb::PieceMeta& p, int i) {
  if (p.tensor().key().size() > kMaxTensorKeyBytes) {
    c.TextAt([i] { return Field("state.shards", i, "tensor.key"); }, p.tensor().key(),
             kMaxTensorKeyBytes, /*plain=*/false);
  }
  if (p.tensor().global_shape_size() > kMaxDims || p.region().offsets_size() > kMaxDims ||
      p.region().lengths_size() > kMaxDims || p.replica_id_size() > kMaxDims) {
    const int most = std::max({p.tensor().global_shape_size(), p.region().offsets_size(),
                               p.region().lengths_size(), p.replica_id_size()});
    c.Count(Field("state.shards", i, "dims"), most, kMaxDims);
  }
}

void CheckCompact(Checker& c, const pb::CompactTensors& run, int i) {
  c.Count(Field("state.compact_tensors", i, "index"), run.index_size(), kMaxPiecesPerRank)
      .Count(Field("state.compact_tensors", i, "replica_id"), run.replica_id_size(), kMaxDims)
      .Count(Field("state.compact_tensors", i, "dtensor.placements"),
             run.dtensor().placements_size(), kMaxDims);
  for (int t = 0; c.ok() && t < run.tensors_size(); ++t) {
    const pb::TensorMeta& m = run.tensors(t);
    if (m.key().size() > kMaxTensorKeyBytes || m.global_shape_size() > kMaxDims) {
      c.TextAt(
           [i, t] {
             return absl::StrCat(Field("state.compact_tensors", i, "tensors"), "[", t, "].key");
           },
           m.key(), kMaxTensorKeyBytes, /*plain=*/false)
          .Count(Field("state.compact_tensors", i, "global_shape"), m.global_shape_size(),
                 kMaxDims);
    }
  }
}

void CheckState(Checker& c, const pb::RankState& s) {
  int64_t pieces = s.shards_size();
  for (const pb::CompactTensors& run : s.compact_tensors()) pieces += run.tensors_size();
  c.Count("state pieces (shards and compact tensors)", pieces, kMaxPiecesPerRank)
      .Count("state.layouts", s.layouts_size(), kMaxPiecesPerRank)
      .Count("state.memory_kinds", s.memory_kinds_size(), kMaxPiecesPerRank)
      .Count("state.mesh_shape", s.mesh_shape_size(), kMaxDims)
      .Count("state.compact_meshes", s.compact_meshes_size(), kMaxPiecesPerRank);
  for (int i = 0; c.ok() && i < s.shards_size(); ++i) CheckPiece(c, s.shards(i), i);
  for (int i = 0; c.ok() && i < s.compact_tensors_size(); ++i) {
    CheckCompact(c, s.compact_tensors(i), i);
  }
  for (int i = 0; c.ok() && i < s.layouts_size(); ++i) {
    if (s.layouts(i).key().size() > kMaxTensorKeyBytes) {
      c.TextAt([i] { return Field("state.layouts", i, "key"); }, s.layouts(i).key(),
               kMaxTensorKeyBytes, /*plain=*/false);
    }
  }
  for (int i = 0; c.ok() && i < s.compact_meshes_size(); ++i) {
    c.Count(Field("state.compact_meshes", i, "shape"), s.compact_meshes(i).shape_size(), kMaxDims)
        .Count(Field("state.compact_meshes", i, "coordinate"),
               s.compact_meshes(i).coordinate_size(), kMaxDims);
  }
}

void CheckJoinOptions(Checker& c, const pb::JoinOperationRequest& r) {
  c.Count("metadata", r.metadata_size(), kMaxMetadataEntries);
  for (const auto& entry : r.metadata()) {
    if (!c.ok()) break;
    const std::string& key = entry.first;  // a name, not a structured binding: clang can't
                                           // capture those in C++17 (the fuzz build)
    c.Text("metadata key", key, kMaxMetadataKeyBytes)
        .TextAt([&key] { return absl::StrCat("metadata[\"", LogPrefix(key), "\"]"); }, entry.second,
                kMaxMetadataValueBytes, /*plain=*/false);
  }
  const pb::RankColumn& column = r.piece_list().column();
  c.Text("piece_list.class_digest", r.piece_list().class_digest(), kMaxDigestBytes, false)
      .Count("piece_list.column.replica_ids", column.replica_ids_size(), kMaxPiecesPerRank)
      .Count("piece_list.column.replica_of_piece", column.replica_of_piece_size(),
             kMaxPiecesPerRank)
      .Count("piece_list.column.flat_ranges", column.flat_ranges_size(), 2 * kMaxPiecesPerRank);
  for (int i = 0; c.ok() && i < column.replica_ids_size(); ++i) {
    if (column.replica_ids(i).coordinates_size() > kMaxDims) {
      c.Count(Field("piece_list.column.replica_ids", i, "coordinates"),
              column.replica_ids(i).coordinates_size(), kMaxDims);
    }
  }
}

}  // namespace

std::string LogPrefix(absl::string_view value, size_t keep) {
  if (value.size() <= keep) return absl::CHexEscape(value);
  return absl::StrCat(absl::CHexEscape(value.substr(0, keep)), "...(", value.size(), " bytes)");
}

absl::Status CheckRegisterWorker(const pb::RegisterWorkerRequest& request) {
  Checker c("RegisterWorker");
  const pb::WorkerInfo& info = request.info();
  c.Text("info.host", info.host(), kMaxHostBytes)
      .Text("info.data_plane_address", info.data_plane_address(), kMaxAddressBytes)
      .Count("info.memory_kinds", info.memory_kinds_size(), kMaxMemoryKinds)
      .Count("memory_held", request.memory_held_size(), kMaxHeldCheckpoints);
  for (int i = 0; c.ok() && i < request.memory_held_size(); ++i) {
    CheckHeld(c, request.memory_held(i), i);
  }
  return c.status();
}

absl::Status CheckHeartbeat(const pb::HeartbeatRequest& request) {
  Checker c("Heartbeat");
  c.Text("worker_id", request.worker_id(), kMaxIdBytes)
      .Count("evicted_memory_checkpoints", request.evicted_memory_checkpoints_size(),
             kMaxEvictedPerHeartbeat)
      .Range("timeout_ms", request.timeout_ms(), 0, kMaxTimeoutMs);
  for (int i = 0; c.ok() && i < request.evicted_memory_checkpoints_size(); ++i) {
    c.TextAt([i] { return Field("evicted_memory_checkpoints", i); },
             request.evicted_memory_checkpoints(i), kMaxNameBytes);
  }
  return c.status();
}

absl::Status CheckDeregisterWorker(const pb::DeregisterWorkerRequest& request) {
  return Checker("DeregisterWorker").Text("worker_id", request.worker_id(), kMaxIdBytes).status();
}

absl::Status CheckAttachRank(const pb::AttachRankRequest& request) {
  return Checker("AttachRank")
      .Text("job", request.job(), kMaxJobNameBytes)
      .Text("worker_id", request.worker_id(), kMaxIdBytes)
      .Range("world_size", request.world_size(), INT32_MIN, kMaxWorldSize)
      .Range("rank", request.rank(), INT32_MIN, kMaxWorldSize - 1)
      .status();
}

absl::Status CheckDetachRank(const pb::DetachRankRequest& request) {
  return Checker("DetachRank")
      .Text("job", request.job(), kMaxJobNameBytes)
      .Text("worker_id", request.worker_id(), kMaxIdBytes)
      .status();
}

absl::Status CheckJoinOperation(const pb::JoinOperationRequest& r) {
  Checker c("JoinOperation");
  c.Text("job", r.job(), kMaxJobNameBytes)
      .Range("world_size", r.world_size(), INT32_MIN, kMaxWorldSize)
      .Range("rank", r.rank(), INT32_MIN, kMaxWorldSize - 1)
      .Text("path", r.path(), kMaxPathBytes)
      .Text("worker_id", r.worker_id(), kMaxIdBytes)
      .Text("operation_id", r.operation_id(), kMaxIdBytes)
      .Range("arrival_deadline_ms", r.arrival_deadline_ms(), INT64_MIN, kMaxTimeoutMs)
      .Text("state_digest", r.state_digest(), kMaxDigestBytes, /*plain=*/false)
      .Text("held_plan_part_body", r.held_plan_part_body(), kMaxIdBytes)
      .Text("persist_to", r.persist_to(), kMaxPathBytes)
      .Text("compression", r.compression(), kMaxIdBytes)
      .Text("process_groups", r.process_groups(), kMaxProcessGroupsBytes, /*plain=*/false);
  if (r.has_memory_replicas()) c.Range("memory_replicas", r.memory_replicas(), INT32_MIN, 1024);
  if (c.ok()) CheckJoinOptions(c, r);
  if (c.ok()) CheckState(c, r.state());
  return c.status();
}

absl::Status CheckJoinOperations(const pb::JoinOperationsRequest& request) {
  return Checker("JoinOperations").Count("joins", request.joins_size(), kMaxJoinsPerCall).status();
}

absl::Status CheckWatchWork(const pb::WatchWorkRequest& request) {
  return Checker("WatchWork").Text("worker_id", request.worker_id(), kMaxIdBytes).status();
}

absl::Status CheckReportProgress(const pb::ReportProgressRequest& request) {
  return Checker("ReportProgress")
      .Text("operation_id", request.operation_id(), kMaxIdBytes)
      .status();
}

absl::Status CheckReportResult(const pb::ReportResultRequest& request) {
  return Checker("ReportResult")
      .Text("operation_id", request.operation_id(), kMaxIdBytes)
      .Text("result.message", request.result().message(), kMaxMessageTextBytes, false)
      .status();
}

absl::Status CheckWaitOperation(const pb::WaitOperationRequest& request) {
  return Checker("WaitOperation")
      .Text("operation_id", request.operation_id(), kMaxIdBytes)
      .status();
}

absl::Status CheckRequestOperation(const pb::RequestOperationRequest& r) {
  Checker c("RequestOperation");
  c.Text("job", r.job(), kMaxJobNameBytes)
      .Text("path", r.path(), kMaxPathBytes)
      .Range("arrival_deadline_ms", r.arrival_deadline_ms(), INT64_MIN, kMaxTimeoutMs)
      .Text("persist_to", r.persist_to(), kMaxPathBytes)
      .Text("compression", r.compression(), kMaxIdBytes)
      .Text("process_groups", r.process_groups(), kMaxProcessGroupsBytes, /*plain=*/false);
  if (r.has_memory_replicas()) c.Range("memory_replicas", r.memory_replicas(), INT32_MIN, 1024);
  return c.status();
}

absl::Status CheckPendingOperation(const pb::PendingOperationRequest& request) {
  return Checker("PendingOperation").Text("job", request.job(), kMaxJobNameBytes).status();
}

absl::Status CheckGetStatus(const pb::GetStatusRequest& request) {
  return Checker("GetStatus")
      .Text("job", request.job(), kMaxJobNameBytes)
      .Text("page_token", request.page_token(), kMaxPageTokenBytes)
      .Range("page_size", request.page_size(), 0, kMaxStatusPageItems)
      .status();
}

absl::Status CheckStartReshard(const pb::StartReshardRequest& r) {
  return Checker("StartReshard")
      .Text("source", r.source(), kMaxPathBytes)
      .Text("destination", r.destination(), kMaxPathBytes)
      .Text("layout_json", r.layout_json(), kMaxLayoutJsonBytes, /*plain=*/false)
      .Range("max_workers", r.max_workers(), 0, INT32_MAX)
      .status();
}

absl::Status CheckPersistReport(const pb::PersistReportRequest& r) {
  Checker c("ReportPersist");
  c.Text("worker_id", r.worker_id(), kMaxIdBytes)
      .Text("persist_id", r.persist_id(), kMaxNameBytes)
      .Count("files", r.files_size(), kMaxFilesPerList)
      .Text("result.message", r.result().message(), kMaxMessageTextBytes, /*plain=*/false);
  for (int i = 0; c.ok() && i < r.files_size(); ++i) {
    c.TextAt([i] { return Field("files", i); }, r.files(i), kMaxNameBytes);
  }
  return c.status();
}

std::string FormatStatusPageToken(const StatusCursor& cursor) {
  return absl::StrCat(cursor.section, ".", cursor.entry, ".", cursor.item);
}

absl::StatusOr<StatusCursor> ParseStatusPageToken(absl::string_view token) {
  StatusCursor cursor;
  if (token.empty()) return cursor;
  std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &cursor.section) ||
      !absl::SimpleAtoi(parts[1], &cursor.entry) || !absl::SimpleAtoi(parts[2], &cursor.item) ||
      cursor.section < 0 || cursor.section >= kStatusSections || cursor.entry < 0 ||
      cursor.item < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GetStatus: page_token \"", LogPrefix(token),
                                                   "\" is not one this coordinator hands out"));
  }
  return cursor;
}

}  // namespace ckpt::coordinator
