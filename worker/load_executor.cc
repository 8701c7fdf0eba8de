#include "worker/load_executor.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "proto/wire_names.h"
#include "storage/checkpoint_reader.h"
#include "worker/region_chunks.h"

namespace ckpt::worker {

absl::Status ExecuteLoadPart(const pb::LoadPlanPart& part, const SessionInfo& session,
                             MemoryGate& gate,
                             const std::function<void(int64_t bytes_done)>& progress) {
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", session.trainer.job);
  if (part.rank() != session.trainer.rank) {
    return absl::InternalError(
        absl::StrCat("load plan part of rank ", part.rank(), " delivered for ", who));
  }
  if (part.reads_size() == 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(part.path());
  if (!reader.ok()) {
    return absl::Status(
        reader.status().code(),
        absl::StrCat(who, ": opening checkpoint ", part.path(), ": ", reader.status().message()));
  }
  int64_t bytes_done = 0;
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
    if (t.memory_kind != pb::MEMORY_HOST || (t.data == nullptr && t.nbytes > 0)) {
      return absl::UnimplementedError(
          absl::StrCat(who, ": tensor ", read.key(), " is in ", MemoryKindName(t.memory_kind),
                       " memory; loading device tensors is not wired into the worker yet"));
    }
    const int64_t elem = t.nbytes / std::max<int64_t>(region->NumElements(), 1);
    for (const RegionChunk& chunk :
         SplitRegion(*region, kReadChunkBytes / std::max<int64_t>(elem, 1))) {
      absl::Status s = gate.Run([&] {
        return (*reader)->ReadRegion(read.key(), chunk.region, t.data + chunk.first_element * elem);
      });
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(who, ": reading ", read.key(), " ", region->DebugString(),
                                         " from ", part.path(), ": ", s.message()));
      }
    }
    bytes_done += t.nbytes;
    if (progress) progress(bytes_done);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
