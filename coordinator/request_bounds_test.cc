// Every bound of coordinator/request_bounds.h: a request at the bound is accepted, one past it
// is refused with InvalidArgument naming the call, the field, its size and the bound.
#include "coordinator/request_bounds.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

template <typename M>
using Check = absl::Status (*)(const M&);

// `set` puts a string of n bytes into the field; at `bound` it passes, at bound + 1 it fails.
template <typename M>
void ExpectText(Check<M> check, const std::function<void(M&, const std::string&)>& set,
                size_t bound, const std::string& call, const std::string& field) {
  SCOPED_TRACE(absl::StrCat(call, " ", field));
  M at;
  set(at, std::string(bound, 'a'));
  EXPECT_TRUE(check(at).ok()) << check(at);
  M over;
  set(over, std::string(bound + 1, 'a'));
  const absl::Status s = check(over);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(call, ": ", field, " is ", bound + 1,
                                                  " bytes, over the bound of ", bound)));
  EXPECT_LT(s.message().size(), 512u) << "the value is not echoed whole";
}

// `add` makes the list n long (or sets the number to n).
template <typename M>
void ExpectCount(Check<M> check, const std::function<void(M&, int64_t)>& add, int64_t bound,
                 const std::string& call, const std::string& field) {
  SCOPED_TRACE(absl::StrCat(call, " ", field));
  M at;
  add(at, bound);
  EXPECT_TRUE(check(at).ok()) << check(at);
  M over;
  add(over, bound + 1);
  const absl::Status s = check(over);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(call, ": ", field)));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(bound + 1)));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(bound)));
}

TEST(RequestBoundsTest, RegisterWorkerStringsAndListsAreBounded) {
  using M = pb::RegisterWorkerRequest;
  const std::string call = "RegisterWorker";
  ExpectText<M>(
      &CheckRegisterWorker, [](M& m, auto v) { m.mutable_info()->set_host(v); }, kMaxHostBytes,
      call, "info.host");
  ExpectText<M>(
      &CheckRegisterWorker, [](M& m, auto v) { m.mutable_info()->set_data_plane_address(v); },
      kMaxAddressBytes, call, "info.data_plane_address");
  ExpectText<M>(
      &CheckRegisterWorker, [](M& m, auto v) { m.add_memory_held()->set_name(v); }, kMaxNameBytes,
      call, "memory_held[0].name");
  ExpectText<M>(
      &CheckRegisterWorker, [](M& m, auto v) { m.add_memory_held()->add_files(v); }, kMaxNameBytes,
      call, "memory_held[0].files[0]");
  ExpectText<M>(
      &CheckRegisterWorker, [](M& m, auto v) { m.add_memory_held()->set_persist_outcome(v); },
      kMaxMessageTextBytes, call, "memory_held[0].persist_outcome");
  ExpectText<M>(
      &CheckRegisterWorker,
      [](M& m, auto v) { m.add_memory_held()->mutable_record()->set_name(v); }, kMaxNameBytes, call,
      "memory_held[0].record.name");
  ExpectText<M>(
      &CheckRegisterWorker,
      [](M& m, auto v) { m.add_memory_held()->mutable_record()->set_published_name(v); },
      kMaxNameBytes, call, "memory_held[0].record.published_name");
  ExpectText<M>(
      &CheckRegisterWorker,
      [](M& m, auto v) { m.add_memory_held()->mutable_record()->set_persist_to(v); }, kMaxPathBytes,
      call, "memory_held[0].record.persist_to");
  ExpectCount<M>(
      &CheckRegisterWorker,
      [](M& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.mutable_info()->add_memory_kinds(pb::MemoryKind(0));
      },
      kMaxMemoryKinds, call, "info.memory_kinds");
  ExpectCount<M>(
      &CheckRegisterWorker,
      [](M& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.add_memory_held();
      },
      kMaxHeldCheckpoints, call, "memory_held");
  ExpectCount<M>(
      &CheckRegisterWorker,
      [](M& m, int64_t n) {
        auto* held = m.add_memory_held();
        for (int64_t i = 0; i < n; ++i) held->add_files();
      },
      kMaxFilesPerList, call, "memory_held[0].files");
}

TEST(RequestBoundsTest, TextThatCouldForgeALogLineIsRefused) {
  pb::RegisterWorkerRequest r;
  r.mutable_info()->set_host("node0\n2026-01-01 info coordinator worker_registered forged");
  absl::Status s = CheckRegisterWorker(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("info.host \"node0\\n2026"));
  EXPECT_THAT(s.message(), HasSubstr("control character"));
  pb::AttachRankRequest a;
  a.set_job("job\x1b[2J");
  EXPECT_THAT(CheckAttachRank(a).message(), HasSubstr("AttachRank: job"));
}

TEST(RequestBoundsTest, WorkerCallsAreBounded) {
  ExpectText<pb::HeartbeatRequest>(
      &CheckHeartbeat, [](auto& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, "Heartbeat",
      "worker_id");
  ExpectText<pb::HeartbeatRequest>(
      &CheckHeartbeat, [](auto& m, auto v) { m.add_evicted_memory_checkpoints(v); }, kMaxNameBytes,
      "Heartbeat", "evicted_memory_checkpoints[0]");
  ExpectCount<pb::HeartbeatRequest>(
      &CheckHeartbeat,
      [](auto& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.add_evicted_memory_checkpoints("x");
      },
      kMaxEvictedPerHeartbeat, "Heartbeat", "evicted_memory_checkpoints");
  ExpectCount<pb::HeartbeatRequest>(
      &CheckHeartbeat, [](auto& m, int64_t n) { m.set_timeout_ms(n); }, kMaxTimeoutMs, "Heartbeat",
      "timeout_ms");
  ExpectText<pb::DeregisterWorkerRequest>(
      &CheckDeregisterWorker, [](auto& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes,
      "DeregisterWorker", "worker_id");
  ExpectText<pb::AttachRankRequest>(
      &CheckAttachRank, [](auto& m, auto v) { m.set_job(v); }, kMaxJobNameBytes, "AttachRank",
      "job");
  ExpectText<pb::AttachRankRequest>(
      &CheckAttachRank, [](auto& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, "AttachRank",
      "worker_id");
  ExpectCount<pb::AttachRankRequest>(
      &CheckAttachRank, [](auto& m, int64_t n) { m.set_world_size(static_cast<int>(n)); },
      kMaxWorldSize, "AttachRank", "world_size");
  ExpectCount<pb::AttachRankRequest>(
      &CheckAttachRank, [](auto& m, int64_t n) { m.set_rank(static_cast<int>(n)); },
      kMaxWorldSize - 1, "AttachRank", "rank");
  ExpectText<pb::DetachRankRequest>(
      &CheckDetachRank, [](auto& m, auto v) { m.set_job(v); }, kMaxJobNameBytes, "DetachRank",
      "job");
  ExpectText<pb::DetachRankRequest>(
      &CheckDetachRank, [](auto& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, "DetachRank",
      "worker_id");
  ExpectText<pb::WatchWorkRequest>(
      &CheckWatchWork, [](auto& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, "WatchWork",
      "worker_id");
  ExpectText<pb::ReportProgressRequest>(
      &CheckReportProgress, [](auto& m, auto v) { m.set_operation_id(v); }, kMaxIdBytes,
      "ReportProgress", "operation_id");
  ExpectText<pb::ReportResultRequest>(
      &CheckReportResult, [](auto& m, auto v) { m.set_operation_id(v); }, kMaxIdBytes,
      "ReportResult", "operation_id");
  ExpectText<pb::ReportResultRequest>(
      &CheckReportResult, [](auto& m, auto v) { m.mutable_result()->set_message(v); },
      kMaxMessageTextBytes, "ReportResult", "result.message");
  ExpectText<pb::WaitOperationRequest>(
      &CheckWaitOperation, [](auto& m, auto v) { m.set_operation_id(v); }, kMaxIdBytes,
      "WaitOperation", "operation_id");
  ExpectText<pb::PendingOperationRequest>(
      &CheckPendingOperation, [](auto& m, auto v) { m.set_job(v); }, kMaxJobNameBytes,
      "PendingOperation", "job");
}

TEST(RequestBoundsTest, PersistReportsAreBounded) {
  using M = pb::PersistReportRequest;
  const std::string call = "ReportPersist";
  ExpectText<M>(
      &CheckPersistReport, [](M& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, call,
      "worker_id");
  ExpectText<M>(
      &CheckPersistReport, [](M& m, auto v) { m.set_persist_id(v); }, kMaxNameBytes, call,
      "persist_id");
  ExpectText<M>(
      &CheckPersistReport, [](M& m, auto v) { m.add_files(v); }, kMaxNameBytes, call, "files[0]");
  ExpectText<M>(
      &CheckPersistReport, [](M& m, auto v) { m.mutable_result()->set_message(v); },
      kMaxMessageTextBytes, call, "result.message");
  ExpectCount<M>(
      &CheckPersistReport,
      [](M& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.add_files();
      },
      kMaxFilesPerList, call, "files");
}

TEST(RequestBoundsTest, JoinStringsAreBounded) {
  using M = pb::JoinOperationRequest;
  const std::string call = "JoinOperation";
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_job(v); }, kMaxJobNameBytes, call, "job");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_path(v); }, kMaxPathBytes, call, "path");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_worker_id(v); }, kMaxIdBytes, call,
      "worker_id");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_operation_id(v); }, kMaxIdBytes, call,
      "operation_id");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_state_digest(v); }, kMaxDigestBytes, call,
      "state_digest");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_held_plan_part_body(v); }, kMaxIdBytes, call,
      "held_plan_part_body");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_persist_to(v); }, kMaxPathBytes, call,
      "persist_to");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.set_process_groups(v); }, kMaxProcessGroupsBytes,
      call, "process_groups");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { (*m.mutable_metadata())[v] = "1"; },
      kMaxMetadataKeyBytes, call, "metadata key");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { (*m.mutable_metadata())["k"] = v; },
      kMaxMetadataValueBytes, call, "metadata[\"k\"]");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.mutable_piece_list()->set_class_digest(v); },
      kMaxDigestBytes, call, "piece_list.class_digest");
  ExpectText<M>(
      &CheckJoinOperation,
      [](M& m, auto v) { m.mutable_state()->add_shards()->mutable_tensor()->set_key(v); },
      kMaxTensorKeyBytes, call, "state.shards[0].tensor.key");
  ExpectText<M>(
      &CheckJoinOperation,
      [](M& m, auto v) { m.mutable_state()->add_compact_tensors()->add_tensors()->set_key(v); },
      kMaxTensorKeyBytes, call, "state.compact_tensors[0].tensors[0].key");
  ExpectText<M>(
      &CheckJoinOperation, [](M& m, auto v) { m.mutable_state()->add_layouts()->set_key(v); },
      kMaxTensorKeyBytes, call, "state.layouts[0].key");
}

TEST(RequestBoundsTest, JoinCountsAreBounded) {
  using M = pb::JoinOperationRequest;
  const std::string call = "JoinOperation";
  ExpectCount<M>(
      &CheckJoinOperation, [](M& m, int64_t n) { m.set_world_size(int(n)); }, kMaxWorldSize, call,
      "world_size");
  ExpectCount<M>(
      &CheckJoinOperation, [](M& m, int64_t n) { m.set_rank(int(n)); }, kMaxWorldSize - 1, call,
      "rank");
  ExpectCount<M>(
      &CheckJoinOperation, [](M& m, int64_t n) { m.set_arrival_deadline_ms(n); }, kMaxTimeoutMs,
      call, "arrival_deadline_ms");
  ExpectCount<M>(
      &CheckJoinOperation, [](M& m, int64_t n) { m.set_memory_replicas(int(n)); }, 1024, call,
      "memory_replicas");
  ExpectCount<M>(
      &CheckJoinOperation,
      [](M& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) (*m.mutable_metadata())[absl::StrCat(i)] = "";
      },
      kMaxMetadataEntries, call, "metadata");
  ExpectCount<M>(
      &CheckJoinOperation,
      [](M& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.mutable_state()->add_shards();
      },
      kMaxPiecesPerRank, call, "state pieces");
  ExpectCount<M>(
      &CheckJoinOperation,
      [](M& m, int64_t n) {
        auto* shape = m.mutable_state()->add_shards()->mutable_tensor();
        for (int64_t i = 0; i < n; ++i) shape->add_global_shape(1);
      },
      kMaxDims, call, "state.shards[0].dims");
  ExpectCount<M>(
      &CheckJoinOperation,
      [](M& m, int64_t n) {
        auto* column = m.mutable_piece_list()->mutable_column();
        for (int64_t i = 0; i < n; ++i) column->add_replica_of_piece(0);
      },
      kMaxPiecesPerRank, call, "piece_list.column.replica_of_piece");
  ExpectCount<pb::JoinOperationsRequest>(
      &CheckJoinOperations,
      [](auto& m, int64_t n) {
        for (int64_t i = 0; i < n; ++i) m.add_joins();
      },
      kMaxJoinsPerCall, "JoinOperations", "joins");
}

TEST(RequestBoundsTest, OperatorCallsAreBounded) {
  using R = pb::RequestOperationRequest;
  ExpectText<R>(
      &CheckRequestOperation, [](R& m, auto v) { m.set_job(v); }, kMaxJobNameBytes,
      "RequestOperation", "job");
  ExpectText<R>(
      &CheckRequestOperation, [](R& m, auto v) { m.set_path(v); }, kMaxPathBytes,
      "RequestOperation", "path");
  ExpectText<R>(
      &CheckRequestOperation, [](R& m, auto v) { m.set_persist_to(v); }, kMaxPathBytes,
      "RequestOperation", "persist_to");
  ExpectText<R>(
      &CheckRequestOperation, [](R& m, auto v) { m.set_process_groups(v); }, kMaxProcessGroupsBytes,
      "RequestOperation", "process_groups");
  using S = pb::StartReshardRequest;
  ExpectText<S>(
      &CheckStartReshard, [](S& m, auto v) { m.set_source(v); }, kMaxPathBytes, "StartReshard",
      "source");
  ExpectText<S>(
      &CheckStartReshard, [](S& m, auto v) { m.set_destination(v); }, kMaxPathBytes, "StartReshard",
      "destination");
  ExpectText<S>(
      &CheckStartReshard, [](S& m, auto v) { m.set_layout_json(v); }, kMaxLayoutJsonBytes,
      "StartReshard", "layout_json");
  using G = pb::GetStatusRequest;
  ExpectText<G>(
      &CheckGetStatus, [](G& m, auto v) { m.set_job(v); }, kMaxJobNameBytes, "GetStatus", "job");
  ExpectText<G>(
      &CheckGetStatus, [](G& m, auto v) { m.set_page_token(v); }, kMaxPageTokenBytes, "GetStatus",
      "page_token");
  ExpectCount<G>(
      &CheckGetStatus, [](G& m, int64_t n) { m.set_page_size(int(n)); }, kMaxStatusPageItems,
      "GetStatus", "page_size");
}

TEST(RequestBoundsTest, LogPrefixKeepsABoundedEscapedPrefix) {
  EXPECT_EQ(LogPrefix("node0"), "node0");
  EXPECT_EQ(LogPrefix("a\nb"), "a\\nb");
  const std::string huge(2 << 20, 'h');
  EXPECT_EQ(LogPrefix(huge), std::string(64, 'h') + "...(2097152 bytes)");
  EXPECT_EQ(LogPrefix(huge, 4), "hhhh...(2097152 bytes)");
}

TEST(RequestBoundsTest, PageTokensRoundTripAndForeignOnesAreRefused) {
  absl::StatusOr<StatusCursor> first = ParseStatusPageToken("");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->section, 0);
  StatusCursor c{3, 7, 12};
  absl::StatusOr<StatusCursor> back = ParseStatusPageToken(FormatStatusPageToken(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->section, 3);
  EXPECT_EQ(back->entry, 7);
  EXPECT_EQ(back->item, 12);
  for (const char* bad : {"x", "1.2", "5.0.0", "-1.0.0", "0.-1.0", "1.2.3.4", "0.0.zz"}) {
    absl::Status s = ParseStatusPageToken(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ckpt::coordinator
