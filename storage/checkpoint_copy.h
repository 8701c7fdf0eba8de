// Copies (and verifies) a committed checkpoint from one store to another
// (storage/checkpoint_store.h), by URL: a directory to s3://, s3:// back to a directory, or one
// directory to another. Every stored byte is checked against the source manifest's XXH3-64
// checksums as it streams through, before the destination commits, so a corrupt or truncated source
// never becomes a committed copy. Memory is bounded: `parallelism` files at a time, one chunk each.
#ifndef CKPT_STORAGE_CHECKPOINT_COPY_H_
#define CKPT_STORAGE_CHECKPOINT_COPY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/verify.h"

namespace ckpt {

struct CopyOptions {
  // Replace a committed checkpoint at the destination (it stays readable until the copy
  // commits); without it one there is AlreadyExists.
  bool overwrite = false;
  // Bytes read and written per step of one file.
  int64_t chunk_bytes = int64_t{8} << 20;
  // Data files copied at once.
  int parallelism = 4;
  // The whole copy's deadline.
  absl::Duration timeout = absl::Hours(1);
};

// What a copy moved.
struct CopyReport {
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t pieces_verified = 0;
  absl::Duration elapsed;
};

// Copies the checkpoint at `from` to `to` (see the file comment). On any error the destination
// write is aborted: nothing new is visible there and an earlier checkpoint at `to` is intact.
// DataLoss naming the source, file and tensor for a byte that disagrees with its checksum.
absl::StatusOr<CopyReport> CopyCheckpoint(const std::string& from, const std::string& to,
                                          const CopyOptions& options = {});

// Verifies the committed checkpoint at `url` through its store, as `ckptctl verify` does for a
// directory: the manifest validated (exact coverage included), each data file's safetensors
// header read and checked against it, and every stored byte read (`parallelism` files at a
// time, one chunk each) and checked against its piece's XXH3-64. Checksum mismatches are
// reported as problems; an unreadable or inconsistent checkpoint is an error naming it.
absl::StatusOr<VerifyReport> VerifyStoredCheckpoint(const std::string& url,
                                                    const CopyOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_COPY_H_
