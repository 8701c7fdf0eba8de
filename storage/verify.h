// Offline checkpoint verification (ckptctl verify): manifest and data-file agreement, every
// checksum, and coverage (every element of every tensor stored by exactly one piece).
#ifndef CKPT_STORAGE_VERIFY_H_
#define CKPT_STORAGE_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"
#include "storage/io_engine.h"

namespace ckpt {

// Findings of a verification; `problems` is empty when the checkpoint is sound.
struct VerifyReport {
  int64_t tensors = 0;
  int64_t pieces = 0;
  int64_t files = 0;
  int64_t manifest_piece_files = 0;  // 0 for a manifest in manifest.pb alone (format 1)
  int64_t bytes_checked = 0;
  std::vector<std::string> problems;
};

// Coverage of each tensor by its pieces (the exact check of sharding/coverage.h): one problem
// per tensor naming its first hole or overlap, empty when each element is stored exactly once.
absl::StatusOr<std::vector<std::string>> CheckCoverage(const pb::Manifest& manifest);

// Verifies the checkpoint without holding its whole manifest: streams the manifest
// (StreamManifestFile, which validates it, coverage included) and, a bounded batch of pieces at
// a time, checks their entries in their data files' headers (CheckpointReader::OpenShare) and
// reads every stored byte verifying checksums, holding at most about `max_batch_bytes` of data
// (and at most 65,536 pieces) in memory; then checks each data file's size and that its header
// holds no entry the manifest does not list. Errors for unverifiable checkpoints: missing,
// incomplete, invalid manifest (which includes pieces that do not tile a tensor exactly), or a
// data file that disagrees with it. Reports as problems bad checksums, files in data/ the
// manifest does not list, and files at the top of the directory that are not manifest.pb,
// data/ or a listed manifest piece file.
absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& path, const IoOptions& io,
                                              int64_t max_batch_bytes = int64_t{256} << 20);

}  // namespace ckpt

#endif  // CKPT_STORAGE_VERIFY_H_
