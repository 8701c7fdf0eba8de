// The direct-read load planner: every rank reads the regions it needs straight from the
// checkpoint (any saved layout to any target layout, since reads assemble a region from every
// stored piece that overlaps it). Correct for every layout change; it reads replicated data
// once per rank that needs it, where the exchange-based plan (planner/load_plan) would
// read it once and move it over the interconnect. No gRPC, no logging.
#ifndef CKPT_COORDINATOR_LOAD_DIRECT_H_
#define CKPT_COORDINATOR_LOAD_DIRECT_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_state.h"
#include "coordinator/manifest_share_builder.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// Reads the manifest of the checkpoint at op.path as a stream (validated, never held whole),
// stats its data files, checks every gathered shard against it (the key exists, dtype and
// global shape agree, the region is inside the tensor) and returns one serialized
// pb::LoadPlanPart per rank, carrying the rank's ManifestShare (the stored pieces its reads
// overlap; coordinator/manifest_share_builder.h) so that its worker opens only that. Errors
// name the rank, tensor, file and checkpoint.
absl::StatusOr<std::vector<RankPlan>> PlanDirectLoad(const Operation& op);

// A checkpoint's manifest read once as a stream for a load (never held whole): its head (the
// manifest without pieces) and the share builder that every read of every rank and every piece
// those reads overlap went through (finished: coordinator/manifest_share_builder.h).
struct StreamedLoad {
  pb::Manifest head;
  std::unique_ptr<ManifestShareBuilder> shares;
};

// Streams the manifest of the checkpoint at op.path past the reads of `op`'s ranks, checks
// them against it and stats its data files, as PlanDirectLoad does (same errors). `on_kept`,
// when set, sees each piece the builder keeps (one a read overlaps), in manifest order: the
// i-th call's piece has kept id i (ManifestShareBuilder::ShareOfPieces).
absl::StatusOr<StreamedLoad> StreamLoad(
    const Operation& op, const std::function<void(const pb::StoredPiece&)>& on_kept = nullptr);

// PlanDirectLoad against `manifest` (validated by the caller) instead of the checkpoint at
// op.path, e.g. a memory checkpoint's manifest from the catalog (coordinator/memory_catalog.h),
// without manifest shares. Only the manifest's tensors are used (a head will do).
absl::StatusOr<std::vector<RankPlan>> PlanDirectLoadFrom(const Operation& op,
                                                         const pb::Manifest& manifest);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_LOAD_DIRECT_H_
