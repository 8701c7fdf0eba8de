#include "worker/save_executor.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "proto/wire_names.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::worker {
namespace {

// Stages the device pieces into their snapshot buffers through the worker's pinned pool, inside
// the gate (closing it stops the staging after the copies in flight). Signals the drain (also
// when there are no device pieces: the host pieces are copied already).
absl::Status StageDeviceSnapshot(absl::Span<const DeviceRange> ranges,
                                 absl::Span<char* const> destinations, const std::string& who,
                                 MemoryGate& gate, const DeviceSnapshotOptions& device,
                                 SnapshotReport* report) {
  if (ranges.empty()) {
    if (device.on_device_drained) device.on_device_drained(*report);
    return absl::OkStatus();
  }
  report->pinned_budget_bytes = device.staging->budget_bytes();
  const absl::Time deadline = absl::Now() + device.timeout;
  absl::StatusOr<PinnedStagingPool::Lease> lease = device.staging->Acquire(deadline);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(who, ": staging device tensors: ", lease.status().message()));
  }
  return gate.Run([&] {
    return StageDeviceToHost(
        *lease, ranges, who, [&gate] { return gate.status(); },
        [&](const StagedChunk& c) {
          std::memcpy(destinations[c.range] + c.offset, c.host, static_cast<size_t>(c.bytes));
          return absl::OkStatus();
        },
        [&] {
          // The pipeline counts bytes as they are consumed; at the drain every byte has left
          // the device, so the report says all of them.
          SnapshotReport at_drain = *report;
          at_drain.device.bytes = 0;
          for (const DeviceRange& r : ranges) at_drain.device.bytes += r.bytes;
          if (device.on_device_drained) device.on_device_drained(at_drain);
        },
        deadline, &report->device);
  });
}

// A planned piece checked against what the trainer shares: the tensor it comes from and its
// region. Errors name the rank and the tensor.
struct PlannedPiece {
  const RegisteredTensor* tensor = nullptr;
  Region region;
};

absl::StatusOr<PlannedPiece> ResolvePlannedPiece(const pb::PlanPiece& piece,
                                                 const SessionInfo& session,
                                                 const DeviceSnapshotOptions& device,
                                                 const std::string& who) {
  if (piece.local_index() < 0 || piece.local_index() >= static_cast<int>(session.tensors.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": tensor ", piece.key(), " (local index ", piece.local_index(), ") is not among the ",
        session.tensors.size(),
        " tensors the trainer shares now (did it re-register its state during the save?)"));
  }
  const RegisteredTensor& t = session.tensors[piece.local_index()];
  absl::StatusOr<Region> region = RegionFromProto(piece.region());
  if (!region.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", piece.key(), ": ", region.status().message()));
  }
  absl::StatusOr<Region> shared = RegionFromProto(t.shard.region());
  if (t.shard.tensor().key() != piece.key() || !shared.ok() || *shared != *region ||
      t.nbytes != piece.size_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the plan's piece ", piece.key(), " ", region->DebugString(),
                     " does not match the shared tensor ", t.shard.tensor().key(),
                     shared.ok() ? absl::StrCat(" ", shared->DebugString()) : std::string()));
  }
  const bool on_device = t.memory_kind == pb::MEMORY_DEVICE;
  if (on_device && device.staging == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": tensor ", piece.key(), " is in device memory (device ", t.device,
                     ") but this worker has no device staging (it serves no GPU)"));
  }
  if ((!on_device && (t.memory_kind != pb::MEMORY_HOST || (t.data == nullptr && t.nbytes > 0))) ||
      (on_device && t.device_ptr == nullptr && t.nbytes > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": tensor ", piece.key(), " is in ",
                                                      MemoryKindName(t.memory_kind),
                                                      " memory not mapped here"));
  }
  return PlannedPiece{&t, *std::move(region)};
}

// The tensor of `piece`, appended to `tensors` the first time its key is seen.
absl::Status AddTensorOnce(const pb::PlanPiece& piece, const std::string& who,
                           std::set<std::string>* keys, std::vector<TensorMeta>* tensors) {
  if (!keys->insert(piece.key()).second) return absl::OkStatus();
  absl::StatusOr<DType> dtype = DTypeFromProto(piece.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", piece.key(), ": ", dtype.status().message()));
  }
  tensors->push_back(
      TensorMeta{piece.key(), *dtype,
                 std::vector<int64_t>(piece.global_shape().begin(), piece.global_shape().end())});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveSnapshot> SnapshotSavePart(const pb::SavePlanPart& part,
                                              const SessionInfo& session, MemoryGate& gate,
                                              const DeviceSnapshotOptions& device) {
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", session.trainer.job);
  if (part.rank() != session.trainer.rank) {
    return absl::InternalError(
        absl::StrCat("save plan part of rank ", part.rank(), " delivered for ", who));
  }
  if (part.staging_dir().empty() && part.files_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": save plan part has no staging dir"));
  }
  SaveSnapshot snapshot;
  snapshot.rank = part.rank();
  snapshot.job = session.trainer.job;
  snapshot.staging_dir = part.staging_dir();
  std::vector<TensorMeta>& tensors = snapshot.tensors;
  std::vector<DataFilePlan>& files = snapshot.files;
  std::set<std::string> keys;
  std::vector<DeviceRange> device_ranges;
  std::vector<char*> device_destinations;
  for (const pb::PlanFile& file : part.files()) {
    snapshot.file_paths.push_back(file.path());
    DataFilePlan plan;
    plan.writer_rank = part.rank();
    for (const pb::PlanPiece& piece : file.pieces()) {
      CKPT_ASSIGN_OR_RETURN(PlannedPiece planned, ResolvePlannedPiece(piece, session, device, who));
      CKPT_RETURN_IF_ERROR(AddTensorOnce(piece, who, &keys, &tensors));
      const RegisteredTensor& t = *planned.tensor;
      const bool on_device = t.memory_kind == pb::MEMORY_DEVICE;
      if (!on_device && t.lent_until_durable) {
        // Lent until the save ends: written from the trainer's mapping, which stays mapped.
        snapshot.mappings.push_back(t.mapping);
        snapshot.report.lent_bytes += t.nbytes;
        plan.pieces.push_back(PieceData{piece.key(), planned.region, t.data, t.nbytes});
        continue;
      }
      // The copy is what gets written: the trainer may change its tensors once this returns.
      snapshot.buffers.emplace_back(new char[std::max<int64_t>(t.nbytes, 1)]);
      if (on_device) {  // staged below, after every host piece
        device_ranges.push_back(DeviceRange{piece.key(), t.device_ptr, t.nbytes});
        device_destinations.push_back(snapshot.buffers.back().get());
        plan.pieces.push_back(
            PieceData{piece.key(), planned.region, snapshot.buffers.back().get(), t.nbytes});
        continue;
      }
      absl::Status copied =
          gate.Copy(snapshot.buffers.back().get(), t.data, static_cast<size_t>(t.nbytes));
      if (!copied.ok()) {
        return absl::Status(copied.code(), absl::StrCat(who, ": stopped copying ", piece.key(),
                                                        ": ", copied.message()));
      }
      snapshot.report.copied_bytes += t.nbytes;
      plan.pieces.push_back(
          PieceData{piece.key(), planned.region, snapshot.buffers.back().get(), t.nbytes});
    }
    files.push_back(std::move(plan));
  }
  if (absl::Status s = StageDeviceSnapshot(device_ranges, device_destinations, who, gate, device,
                                           &snapshot.report);
      !s.ok()) {
    return s;
  }
  return snapshot;
}

absl::StatusOr<std::string> WriteSnapshot(const SaveSnapshot& snapshot,
                                          const std::function<void(int64_t bytes_done)>& progress,
                                          const std::function<bool()>& cancelled) {
  const std::string who = absl::StrCat("rank ", snapshot.rank, " of job ", snapshot.job);
  const std::vector<DataFilePlan>& files = snapshot.files;
  // One file at a time (file i is r<rank>_<i>), so that progress can be reported between them.
  pb::Manifest written;
  int64_t bytes_done = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat(who, ": the operation was aborted; stopped after ",
                                               i, " of ", files.size(), " data files"));
    }
    absl::StatusOr<WrittenData> data = WriteDataFiles(
        snapshot.staging_dir, snapshot.tensors, {files[i]}, static_cast<int>(i), WriteOptions());
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(who, ": writing ", snapshot.file_paths[i], " into ",
                                       snapshot.staging_dir, ": ", data.status().message()));
    }
    for (pb::StoredPiece& p : data->pieces) *written.add_pieces() = std::move(p);
    for (pb::DataFile& f : data->files) *written.add_files() = std::move(f);
    for (const PieceData& p : files[i].pieces) bytes_done += p.size_bytes;
    if (progress) progress(bytes_done);
  }
  return written.SerializeAsString();
}

absl::StatusOr<std::string> ExecuteSavePart(
    const pb::SavePlanPart& part, const SessionInfo& session,
    const std::function<void(int64_t bytes_done)>& progress) {
  MemoryGate gate;
  absl::StatusOr<SaveSnapshot> snapshot = SnapshotSavePart(part, session, gate);
  if (!snapshot.ok()) return snapshot.status();
  return WriteSnapshot(*snapshot, progress);
}

}  // namespace ckpt::worker
