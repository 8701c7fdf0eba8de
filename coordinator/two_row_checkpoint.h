// Test fixture shared by the load planners' tests: a small committed checkpoint on disk.
#ifndef CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_
#define CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_

#include <string>

namespace ckpt::coordinator {

// A fresh path under the test's TEST_TMPDIR (else /tmp) for `name`.
std::string TmpPath(const std::string& name);

// Writes tensor "w" (int32, 2 x 4, values 0..7 row-major) as two row pieces, written by ranks 0
// and 1, to TmpPath(name) (replacing a checkpoint there); returns the path. A write failure is
// a test failure.
std::string WriteTwoRowCheckpoint(const std::string& name);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_TWO_ROW_CHECKPOINT_H_
