// Test fixture shared by the load planners' tests: a small committed checkpoint on disk.
#ifndef CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_
#define CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "coordinator/job_state.h"
#include "proto/coordinator.pb.h"
#include "proto/manifest.pb.h"

namespace ckpt::coordinator {

// A fresh path under the test's TEST_TMPDIR (else /tmp) for `name`.
std::string TmpPath(const std::string& name);

// Writes tensor "w" (int32, 2 x 4, values 0..7 row-major) as two row pieces, written by ranks 0
// and 1, to TmpPath(name) (replacing a checkpoint there); returns the path. A write failure is
// a test failure.
std::string WriteTwoRowCheckpoint(const std::string& name);

// Rows [first, first + count) of "w" as a rank describes them, its global shape `rows` x 4
// (the checkpoint's is 2 x 4).
pb::PieceMeta Rows(int64_t first, int64_t count, int64_t rows = 2);

// A load of the checkpoint at `path` by three ranks: 0 and 1 replicate the whole tensor, rank 2
// needs row 1 only.
Operation ThreeRankLoad(const std::string& path);

// The stored piece (key and region) that `unit` of exchange-load part `part` reads: units index
// the part's manifest share, its pieces then its unread pieces. A broken share is a test
// failure (and an empty piece).
pb::StoredPiece UnitPiece(const pb::LoadPlanPart& part, const pb::LoadUnitEntry& unit);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_
