// Test helper (testonly): an empty directory for a test under Bazel's TEST_TMPDIR.
#ifndef CKPT_STORAGE_TEST_DIR_H_
#define CKPT_STORAGE_TEST_DIR_H_

#include <string>

namespace ckpt {

// $TEST_TMPDIR/name (or /tmp/name), removed with its contents and made again; a gtest failure
// (not an abort) when that is not possible.
std::string TestDir(const std::string& name);

}  // namespace ckpt

#endif  // CKPT_STORAGE_TEST_DIR_H_
