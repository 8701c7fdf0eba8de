// Parallel positional file I/O for checkpoints: writes whole files from in-memory segments and
// reads byte ranges into caller memory, computing XXH3-64 checksums while the bytes stream
// through. Work is spread over a bounded set of threads, each with a few transfers in flight
// (io_uring when available, pread/pwrite otherwise) and, with O_DIRECT, a bounded pool of large
// aligned staging buffers.
#ifndef CKPT_STORAGE_IO_ENGINE_H_
#define CKPT_STORAGE_IO_ENGINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

// Which transfer mechanism to use. kAuto picks io_uring when the kernel allows it.
enum class IoBackend { kAuto, kUring, kPosix };

// True when io_uring can be set up in this process (kernel support, not blocked by seccomp).
bool UringAvailable();

// What the engine actually did (for tests and benchmarks).
struct IoStats {
  int64_t uring_files = 0;       // files / ranges served through io_uring
  int64_t posix_files = 0;       // ... through pread/pwrite
  int64_t direct_files = 0;      // ... with O_DIRECT
  int64_t direct_fallbacks = 0;  // O_DIRECT refused by the filesystem; buffered instead
  int64_t bytes = 0;
};

// Tuning knobs. Memory held by staging buffers is at most
// num_threads * queue_depth * buffer_bytes (only with direct_io).
struct IoOptions {
  int num_threads = 4;
  int queue_depth = 4;                      // transfers in flight per thread
  int64_t buffer_bytes = int64_t{8} << 20;  // transfer size; a multiple of 4096
  bool direct_io = false;                   // O_DIRECT with aligned staging, when allowed
  IoBackend backend = IoBackend::kAuto;
  bool fsync = true;         // fsync each written file before returning
  IoStats* stats = nullptr;  // filled in when not null
};

// A run of bytes written at the next position of a file. When `checksum` is set, its checksum
// is returned: with block_bytes == 0 the XXH3-64 of the run; otherwise the XXH3-64 of each
// block_bytes block and their RangeChecksum (storage/checksum.h).
struct WriteSegment {
  const void* data = nullptr;
  int64_t size = 0;
  bool checksum = false;
  int64_t block_bytes = 0;
};

// One file to create (truncating any existing file) from consecutive segments.
struct FileWrite {
  std::string path;
  std::vector<WriteSegment> segments;
};

// Checksums of one segment (zero / empty when not requested).
struct SegmentChecksum {
  uint64_t xxh3 = 0;
  std::vector<uint64_t> blocks;
};

struct FileWriteResult {
  int64_t size = 0;
  std::vector<SegmentChecksum> checksums;  // one per segment
};

// Writes every file (in parallel across threads) and fsyncs them when options.fsync. Errors
// name the file.
absl::StatusOr<std::vector<FileWriteResult>> WriteFiles(const std::vector<FileWrite>& files,
                                                        const IoOptions& options);

// Read `length` bytes at `offset` of `path` into `dest`. When `verify`, the bytes' XXH3-64 must
// equal expected[0] (block_bytes == 0), or each consecutive block_bytes block's hash must equal
// expected[i] (block_bytes > 0); a mismatch is DataLoss naming `label` and the file.
struct RangeRead {
  std::string path;
  int64_t offset = 0;
  int64_t length = 0;
  void* dest = nullptr;
  bool verify = false;
  int64_t block_bytes = 0;
  std::vector<uint64_t> expected;
  std::string label;  // e.g. the tensor key and region, for error messages
};

// Performs all reads in parallel. A range past the end of its file is DataLoss ("truncated").
absl::Status ReadRanges(const std::vector<RangeRead>& reads, const IoOptions& options);

}  // namespace ckpt

#endif  // CKPT_STORAGE_IO_ENGINE_H_
