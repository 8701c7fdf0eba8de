// Executes a save plan part the way a worker does, without tensor bytes: each planned data file
// is written as its real safetensors header followed by a hole (ftruncate) of the data
// section's size, so the file reads as zeros; the record returned for the coordinator's commit
// is what storage's writer records for all-zero pieces (entry names, offsets, XXH3 checksums
// and block checksums of zeros). The committed checkpoint is therefore valid (`ckptctl verify`
// passes; every element is zero) while no tensor byte was produced or copied.
//
// For ckpt_loadgen only: it proves the coordinator's planner and committer on a real save
// without the data movement a real worker does.
#ifndef CKPT_TOOLS_LOADGEN_SPARSE_SAVE_H_
#define CKPT_TOOLS_LOADGEN_SPARSE_SAVE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace ckpt::loadgen {

// XXH3-64 (seed 0) of `n` zero bytes (n at most the default checksum block, 4 MiB); cached.
uint64_t ZeroBytesHash(int64_t n);

// Writes the files of `part` into part.staging_dir() (file i as data/r<rank>_<i>.safetensors,
// as the worker names them; a planned path that differs is InvalidArgument) and returns the
// serialized pb::Manifest with the pieces and files written. `own` is the rank's pieces as it
// described them (expanded): a planned piece named by local index alone is own[local_index],
// as a worker resolves it (pb::PlanPiece); its size must match. With `fsync`, each file is
// synced like a real worker's. Errors name the rank and file.
absl::StatusOr<std::string> WriteSparseSavePart(
    const pb::SavePlanPart& part, const google::protobuf::RepeatedPtrField<pb::PieceMeta>& own,
    bool fsync);

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_SPARSE_SAVE_H_
