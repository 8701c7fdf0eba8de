#include "worker/load_executor.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/wire_names.h"
#include "storage/checkpoint_reader.h"
#include "storage/manifest_share.h"
#include "worker/region_chunks.h"

namespace ckpt::worker {
namespace {

constexpr absl::Duration kDeviceStagingTimeout = absl::Minutes(10);

absl::Status NoStaging(const RegisteredTensor& t, const std::string& who) {
  return absl::FailedPreconditionError(
      absl::StrCat(who, ": tensor ", t.shard.tensor().key(), " is in device memory (device ",
                   t.device, ") but this worker has no device staging (it serves no GPU)"));
}

// Reads `region` of `key` chunk by chunk into pinned buffers and copies them onto the device
// tensor `t` (read of chunk k+1 overlapping the copy of chunk k).
absl::Status ReadOntoDevice(CheckpointReader& reader, const std::string& key, const Region& region,
                            int64_t elem, const RegisteredTensor& t, PinnedStagingPool& staging,
                            MemoryGate& gate, const std::string& who) {
  const absl::Time deadline = absl::Now() + kDeviceStagingTimeout;
  absl::StatusOr<PinnedStagingPool::Lease> lease = staging.Acquire(deadline);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(who, ": staging ", key, ": ", lease.status().message()));
  }
  const std::vector<RegionChunk> pieces =
      SplitRegion(region, std::max<int64_t>(lease->chunk_bytes() / std::max<int64_t>(elem, 1), 1));
  std::vector<ChunkSpec> chunks;
  for (const RegionChunk& c : pieces) {
    chunks.push_back(ChunkSpec{0, c.first_element * elem, c.region.NumElements() * elem});
  }
  const DeviceRange range{key, t.device_ptr, t.nbytes};
  size_t next = 0;
  return gate.Run([&] {
    return StageHostToDevice(
        *lease, {&range, 1}, chunks, who, [&gate] { return gate.status(); },
        [&](const StagedChunk& c) { return reader.ReadRegion(key, pieces[next++].region, c.host); },
        deadline, nullptr);
  });
}

// The checkpoint of `part`: only the share of its manifest the coordinator sent with it, or
// (a part without one) the whole manifest.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenForPart(const pb::LoadPlanPart& part) {
  if (part.manifest_share().empty()) return CheckpointReader::Open(part.path());
  pb::ManifestShare share;
  if (!share.ParseFromString(part.manifest_share())) {
    return absl::DataLossError("the plan part's manifest share is not a valid protobuf");
  }
  absl::StatusOr<pb::Manifest> manifest = ExpandManifestShare(share);
  if (!manifest.ok()) return manifest.status();
  return CheckpointReader::OpenShare(part.path(), *std::move(manifest));
}

}  // namespace

absl::Status CopyOntoDevice(const RegisteredTensor& tensor, const char* host,
                            PinnedStagingPool* staging, MemoryGate& gate, const std::string& who) {
  if (staging == nullptr) return NoStaging(tensor, who);
  const absl::Time deadline = absl::Now() + kDeviceStagingTimeout;
  absl::StatusOr<PinnedStagingPool::Lease> lease = staging->Acquire(deadline);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(who, ": staging ", tensor.shard.tensor().key(), ": ",
                                     lease.status().message()));
  }
  const DeviceRange range{tensor.shard.tensor().key(), tensor.device_ptr, tensor.nbytes};
  const std::vector<ChunkSpec> chunks = CutIntoChunks({&range, 1}, lease->chunk_bytes());
  return gate.Run([&] {
    return StageHostToDevice(
        *lease, {&range, 1}, chunks, who, [&gate] { return gate.status(); },
        [&](const StagedChunk& c) {
          std::memcpy(c.host, host + c.offset, static_cast<size_t>(c.bytes));
          return absl::OkStatus();
        },
        deadline, nullptr);
  });
}

// Host region reads gathered for one ReadRegions call (through the gate: they write into the
// trainer's memory).
struct ReadBatch {
  std::vector<CheckpointReader::RegionRead> reads;
  std::vector<std::string> keys;  // the tensors, for the error message
  int64_t bytes = 0;

  void Add(const std::string& key, const Region& region, void* dest, int64_t n) {
    reads.push_back({key, region, dest});
    if (keys.empty() || keys.back() != key) keys.push_back(key);
    bytes += n;
  }
  absl::Status Flush(const CheckpointReader& reader, MemoryGate& gate, const std::string& who,
                     const std::string& path) {
    if (reads.empty()) return absl::OkStatus();
    absl::Status s = gate.Run([&] { return reader.ReadRegions(reads); });
    if (!s.ok()) {
      const std::string what = keys.size() == 1 ? keys[0]
                                                : absl::StrCat(keys.front(), " .. ", keys.back(),
                                                               " (", keys.size(), " tensors)");
      return absl::Status(s.code(),
                          absl::StrCat(who, ": reading ", what, " from ", path, ": ", s.message()));
    }
    reads.clear();
    keys.clear();
    bytes = 0;
    return absl::OkStatus();
  }
};

absl::Status ExecuteLoadPart(const pb::LoadPlanPart& part, const SessionInfo& session,
                             MemoryGate& gate,
                             const std::function<void(int64_t bytes_done)>& progress,
                             PinnedStagingPool* staging) {
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", session.trainer.job);
  if (part.rank() != session.trainer.rank) {
    return absl::InternalError(
        absl::StrCat("load plan part of rank ", part.rank(), " delivered for ", who));
  }
  if (part.reads_size() == 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = OpenForPart(part);
  if (!reader.ok()) {
    return absl::Status(
        reader.status().code(),
        absl::StrCat(who, ": opening checkpoint ", part.path(), ": ", reader.status().message()));
  }
  int64_t bytes_done = 0;
  ReadBatch batch;
  for (const pb::LoadRead& read : part.reads()) {
    if (absl::Status closed = gate.status(); !closed.ok()) {
      return absl::Status(closed.code(), absl::StrCat(who, ": stopped before ", read.key(), ": ",
                                                      closed.message()));
    }
    if (read.local_index() < 0 || read.local_index() >= static_cast<int>(session.tensors.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": tensor ", read.key(), " (local index ", read.local_index(), ") is not among the ",
          session.tensors.size(),
          " tensors the trainer shares now (did it re-register its state during the load?)"));
    }
    const RegisteredTensor& t = session.tensors[read.local_index()];
    absl::StatusOr<Region> region = RegionFromProto(read.region());
    absl::StatusOr<Region> shared = RegionFromProto(t.shard.region());
    if (!region.ok() || !shared.ok() || t.shard.tensor().key() != read.key() ||
        *region != *shared || t.nbytes != read.size_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(who, ": the plan's read of ", read.key(),
                                                        " does not match the shared tensor ",
                                                        t.shard.tensor().key()));
    }
    const int64_t elem = t.nbytes / std::max<int64_t>(region->NumElements(), 1);
    if (t.memory_kind == pb::MEMORY_DEVICE) {
      if (staging == nullptr) return NoStaging(t, who);
      CKPT_RETURN_IF_ERROR(batch.Flush(**reader, gate, who, part.path()));
      absl::Status s = ReadOntoDevice(**reader, read.key(), *region, elem, t, *staging, gate, who);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(s.message(), " (reading ", read.key(), " from ",
                                                   part.path(), ")"));
      }
      bytes_done += t.nbytes;
      if (progress) progress(bytes_done);
      continue;
    }
    if (t.memory_kind != pb::MEMORY_HOST || (t.data == nullptr && t.nbytes > 0)) {
      return absl::FailedPreconditionError(absl::StrCat(who, ": tensor ", read.key(), " is in ",
                                                        MemoryKindName(t.memory_kind),
                                                        " memory not mapped here"));
    }
    // Host reads are batched across tensors, up to kReadChunkBytes a batch (one parallel
    // ReadRegions: a checkpoint in an object store reads the batch's ranges concurrently
    // instead of one round trip per tensor).
    for (const RegionChunk& chunk :
         SplitRegion(*region, kReadChunkBytes / std::max<int64_t>(elem, 1))) {
      const int64_t chunk_bytes = chunk.region.NumElements() * elem;
      if (batch.bytes > 0 && batch.bytes + chunk_bytes > kReadChunkBytes) {
        CKPT_RETURN_IF_ERROR(batch.Flush(**reader, gate, who, part.path()));
        if (progress) progress(bytes_done);  // every tensor before this one is in
      }
      batch.Add(read.key(), chunk.region, t.data + chunk.first_element * elem, chunk_bytes);
    }
    bytes_done += t.nbytes;
  }
  const bool batched = batch.bytes > 0;
  CKPT_RETURN_IF_ERROR(batch.Flush(**reader, gate, who, part.path()));
  if (batched && progress) progress(bytes_done);
  return absl::OkStatus();
}

}  // namespace ckpt::worker
