// The part of a memory checkpoint's manifest that one rank's load part needs. A load or receive
// from the memory tier carries the manifest in each part (LoadPlanPart.memory_manifest: the
// workers read units by piece index and resolve tensors by key); sending the whole manifest to
// every rank made each part grow with the whole checkpoint. Pure: no gRPC, threads or logging.
#ifndef CKPT_COORDINATOR_MANIFEST_SHARE_H_
#define CKPT_COORDINATOR_MANIFEST_SHARE_H_

#include "proto/coordinator.pb.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// `manifest` cut down to what `part` refers to, with piece indices unchanged: the stored pieces
// of the part's units in full and every other piece as an empty placeholder; the tensors of
// those pieces and of the part's requests; the data files of those pieces; the format version
// and checksum block size. The saved layout, user metadata and step, which a worker never
// reads from a plan part, are left out.
pb::Manifest ManifestShareFor(const pb::Manifest& manifest, const pb::LoadPlanPart& part);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_MANIFEST_SHARE_H_
