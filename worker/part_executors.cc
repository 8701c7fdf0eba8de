#include "worker/part_executors.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/store_url.h"
#include "proto/wire_names.h"
#include "spdlog/spdlog.h"
#include "worker/load_communicator.h"
#include "worker/load_exchange_executor.h"
#include "worker/load_executor.h"
#include "worker/memory_save.h"
#include "worker/object_upload.h"
#include "worker/reshard_executor.h"
#include "worker/save_executor.h"

namespace ckpt::worker {

namespace {

// For a part whose staging directory `*dir` is a store write's staging URL (a save or reshard to
// s3://...): makes `scratch` under the options' root, points `*dir` at it and returns the URL.
// "" (nothing made) for any other part.
absl::StatusOr<std::string> StageLocally(const HostSaveOptions* options, int rank, std::string* dir,
                                         std::optional<ScratchDir>& scratch) {
  if (!IsObjectStoreLocation(*dir)) return "";
  absl::StatusOr<ScratchDir> made = ScratchDir::Create(
      options != nullptr ? options->object_scratch_dir : "", absl::StrCat("r", rank));
  if (!made.ok()) return made.status();
  scratch.emplace(*std::move(made));
  std::string staging_url = std::move(*dir);
  *dir = scratch->path();
  return staging_url;
}

// Uploads the files of `written` (the rank's record) from scratch directory `dir` into the
// store write at `staging_url`; returns the record.
absl::StatusOr<std::string> Upload(const HostSaveOptions* options, const pb::WorkItem& item,
                                   const std::string& dir, const std::string& staging_url,
                                   std::string written, MemoryGate& gate) {
  const absl::Time start = absl::Now();
  pb::Manifest record;
  if (!record.ParseFromString(written)) {
    return absl::InternalError(absl::StrCat("rank ", item.rank(), ": unreadable written record"));
  }
  const absl::Duration timeout =
      options != nullptr ? options->object_upload_timeout : absl::Hours(1);
  int64_t bytes = 0;
  for (const pb::DataFile& f : record.files()) bytes += f.size_bytes();
  absl::Status uploaded = UploadDataFiles(
      dir, record, staging_url, start + timeout, [&gate] { return gate.closed(); },
      absl::StrCat("rank ", item.rank(), " of job ", item.job()));
  spdlog::info("part_uploaded op={} rank={} objects={} bytes={} seconds={:.3f} ok={}",
               item.operation_id(), item.rank(), record.files_size(), bytes,
               absl::ToDoubleSeconds(absl::Now() - start), uploaded.ok());
  if (!uploaded.ok()) return uploaded;
  return written;
}

}  // namespace

DeviceSnapshotOptions SavePartExecutor::SnapshotOptions(const pb::WorkItem& item,
                                                        const pb::SavePlanPart& part) {
  DeviceSnapshotOptions device;
  // A memory save holds host bytes only: device pieces are refused (no staging pool).
  device.staging = part.memory_checkpoint().empty() ? device_staging_ : nullptr;
  // A storage save is pipelined through the host pool; a memory save keeps its copies.
  if (part.memory_checkpoint().empty() && host_save_ != nullptr) {
    device.host_pool = host_save_->pool;
    device.direct_io = host_save_->direct_io;
  }
  device.on_device_drained = [this, &item](const SnapshotReport& r) {
    pb::SaveSnapshotReport report;
    report.set_copied_bytes(r.copied_bytes);
    report.set_lent_bytes(r.lent_bytes);
    report.set_device_bytes(r.device.bytes);
    report.set_device_over_pinned_budget(r.device.over_budget);
    report.set_pinned_budget_bytes(r.pinned_budget_bytes);
    report.set_snapshot_waited_for_writes(r.waited_for_writes);
    report.set_bytes_written_before_snapshot(r.bytes_written_before_snapshot);
    if (on_snapshot_) on_snapshot_(item.operation_id(), item.rank(), report);
  };
  return device;
}

PartOutcome SavePartExecutor::Execute(const PartRun& run) {
  const absl::Time start = absl::Now();
  const pb::WorkItem& item = run.item;
  PartOutcome out;
  pb::SavePlanPart part;
  if (!part.ParseFromString(item.plan_part())) {
    out.status = absl::InvalidArgumentError("unreadable save plan part");
    return out;
  }
  // Copy out of the trainer's memory first; the trainer may train on (its Save returns) once
  // every byte it shares has left its memory (device bytes: the last staging copy completed),
  // while the copy is written.
  MemoryGate& gate = run.gate;
  DeviceSnapshotOptions device = SnapshotOptions(item, part);
  // A save to a store URL: the files go to a scratch directory first, then up to the store.
  // (A memory save keeps its files in the tier; its staging_dir is not a place to write.)
  std::optional<ScratchDir> scratch;
  std::string dir = part.staging_dir();
  absl::StatusOr<std::string> store_staging =
      part.memory_checkpoint().empty() ? StageLocally(host_save_, item.rank(), &dir, scratch) : "";
  if (!store_staging.ok()) {
    out.status = store_staging.status();
    return out;
  }
  part.set_staging_dir(dir);
  absl::StatusOr<SaveSnapshot> snapshot = SnapshotSavePart(part, *run.session, gate, device);
  if (!snapshot.ok()) {
    out.status = snapshot.status();
  } else {
    const StagingStats& staged = snapshot->report.device;
    spdlog::info(
        "save_part_snapshotted op={} rank={} bytes={} seconds={:.3f} copied_bytes={} "
        "lent_bytes={} device_bytes={} device_chunks={} device_drained_s={:.3f} "
        "device_over_pinned_budget={} device_bytes_written_before_snapshot={} "
        "pool_chunks={} host_waited_for_pool={} host_bytes_written_before_snapshot={}",
        item.operation_id(), item.rank(), part.total_bytes(),
        absl::ToDoubleSeconds(absl::Now() - start), snapshot->report.copied_bytes,
        snapshot->report.lent_bytes, staged.bytes, staged.chunks,
        absl::ToDoubleSeconds(staged.until_drained), staged.over_budget,
        snapshot->report.bytes_written_before_snapshot, snapshot->report.pool_chunks,
        snapshot->report.host_waited_for_pool, snapshot->report.host_bytes_written_before_snapshot);
    absl::StatusOr<std::string> done =
        part.memory_checkpoint().empty()
            ? WriteSnapshot(*snapshot, run.progress, [&gate] { return gate.closed(); })
            : KeepSnapshotInMemory(part, item.operation_id(), *snapshot, MemoryContext(), gate);
    if (done.ok() && scratch.has_value()) {
      done = Upload(host_save_, item, scratch->path(), *store_staging, *std::move(done), gate);
    }
    out.status = done.status();
    if (done.ok()) out.written = *std::move(done);
    // Awaiting background persistence: never evicted until the coordinator's PersistEnded.
    if (done.ok() && part.persist_pending() && MemoryContext().tier != nullptr) {
      MemoryContext().tier->Pin(part.memory_checkpoint());
    }
  }
  const SnapshotReport* report = snapshot.ok() ? &snapshot->report : nullptr;
  spdlog::info(
      "save_part_written op={} rank={} bytes={} files={} seconds={:.3f} ok={} "
      "direct_io_files={} buffered_files={} direct_io_refused={}",
      item.operation_id(), item.rank(), part.total_bytes(), part.files_size(),
      absl::ToDoubleSeconds(absl::Now() - start), out.status.ok(),
      report ? report->direct_io_files : 0, report ? report->buffered_files : 0,
      report ? report->direct_io_refused : false);
  return out;
}

MemorySaveContext SavePartExecutor::MemoryContext() const {
  MemorySaveContext context;
  context.tier = memory_.memory_tier == nullptr ? nullptr : *memory_.memory_tier;
  if (memory_.link == nullptr) return context;
  FillDataPlaneEndpoint(memory_, &context);
  return context;
}

PartOutcome LoadPartExecutor::Execute(const PartRun& run) {
  const absl::Time start = absl::Now();
  const pb::WorkItem& item = run.item;
  PartOutcome out;
  pb::LoadPlanPart part;
  if (!part.ParseFromString(item.plan_part())) {
    out.status = absl::InvalidArgumentError("unreadable load plan part");
    return out;
  }
  if (part.algorithm() == pb::LOAD_ALGORITHM_UNSPECIFIED || part.algorithm() == pb::LOAD_DIRECT) {
    out.status = ExecuteLoadPart(part, *run.session, run.gate, run.progress, env_.device_staging);
    if (out.status.ok()) out.bytes_read = part.total_bytes();
  } else {
    out = ExecuteExchange(run, part);
  }
  spdlog::info("load_part_done op={} rank={} bytes={} tensors={} seconds={:.3f} ok={}",
               item.operation_id(), item.rank(), part.total_bytes(), part.reads_size(),
               absl::ToDoubleSeconds(absl::Now() - start), out.status.ok());
  return out;
}

PartOutcome LoadPartExecutor::ExecuteExchange(const PartRun& run, const pb::LoadPlanPart& part) {
  ExchangeLoadContext context;
  FillDataPlaneEndpoint(env_, &context);
  context.cuda_device = env_.link->options().info.gpu();
  if (env_.memory_tier != nullptr) context.memory_tier = *env_.memory_tier;
  ExchangeLoadStats stats;
  PartOutcome out;
  out.status = ExecuteExchangeLoadPart(part, *run.session, context, run.gate, &stats, run.progress,
                                       env_.device_staging);
  out.bytes_read = stats.bytes_read;
  // DataLoss (a verified receive caught corrupt bytes) is a root cause: reported at once.
  if (!out.status.ok() && !run.gate.closed() && out.status.code() != absl::StatusCode::kDataLoss) {
    AwaitAbort(run.gate);
  }
  spdlog::info(
      "load_part_exchanged op={} rank={} group=\"{}\" group_rank={} group_world={} algorithm={} "
      "transport=\"{}\" transport_reason=\"{}\" "
      "waves={} bytes_read={} bytes_sent={} bytes_received={} bytes_scattered={} "
      "rendezvous_s={:.3f} communicator_reused={} read_s={:.3f} exchange_s={:.3f} "
      "scatter_s={:.3f}",
      run.item.operation_id(), run.item.rank(), part.group(), CommunicatorRank(part),
      part.world_size(), LoadAlgorithmName(part.algorithm()), LoadTransportName(part),
      part.transport_reason(), part.waves_size(), stats.bytes_read, stats.bytes_sent,
      stats.bytes_received, stats.bytes_scattered, absl::ToDoubleSeconds(stats.rendezvous_time),
      stats.communicator_reused, absl::ToDoubleSeconds(stats.read_time),
      absl::ToDoubleSeconds(stats.exchange_time), absl::ToDoubleSeconds(stats.scatter_time));
  return out;
}

void LoadPartExecutor::AwaitAbort(const MemoryGate& gate) const {
  // A peer that died mid-exchange shows up here as a broken connection; the coordinator
  // notices the dead worker within its lease and aborts the operation naming it. Give it
  // that long, so every rank receives the root cause rather than this rank's symptom
  // (the coordinator keeps the first diagnosis; this result follows either way).
  const absl::Time until = absl::Now() + env_.link->lease() + absl::Seconds(1);
  while (!gate.closed() && absl::Now() < until &&
         (env_.stopping == nullptr || !env_.stopping->HasBeenNotified())) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

PartOutcome ReshardPartExecutor::Execute(const PartRun& run) {
  // No trainer: the worker reads the source checkpoint and writes the rank's files itself.
  const absl::Time start = absl::Now();
  const pb::WorkItem& item = run.item;
  MemoryGate& gate = run.gate;
  PartOutcome out;
  pb::ReshardPlanPart part;
  ReshardPartStats stats;
  if (!part.ParseFromString(item.plan_part())) {
    out.status = absl::InvalidArgumentError("unreadable reshard plan part");
  } else {
    // A reshard to a store URL: the files go to a scratch directory first, then up to the store.
    std::optional<ScratchDir> scratch;
    std::string dir = part.staging_dir();
    const absl::StatusOr<std::string> url = StageLocally(host_save_, item.rank(), &dir, scratch);
    part.set_staging_dir(dir);
    absl::StatusOr<std::string> done =
        url.ok() ? ExecuteReshardPart(
                       part, run.progress, [&gate] { return gate.closed(); }, &stats)
                 : url.status();
    if (done.ok() && scratch.has_value()) {
      done = Upload(host_save_, item, dir, *url, *std::move(done), gate);
    }
    out.status = done.status();
    if (done.ok()) out.written = *std::move(done);
    out.bytes_read = stats.bytes_read;
  }
  spdlog::info(
      "reshard_part_done op={} rank={} bytes={} files={} pieces={} bytes_read={} read_s={:.3f} "
      "write_s={:.3f} seconds={:.3f} ok={}",
      item.operation_id(), item.rank(), part.total_bytes(), stats.files, stats.pieces,
      stats.bytes_read, stats.read_seconds, stats.write_seconds,
      absl::ToDoubleSeconds(absl::Now() - start), out.status.ok());
  return out;
}

}  // namespace ckpt::worker
