// Assembling the pieces of a target layout from a committed checkpoint: the byte runs each
// destination piece needs (from a sharding/reshard_plan.h plan) are read from the source
// pieces as checksum-block aligned, verified spans through the parallel I/O engine, in
// batches of bounded staging memory, and copied into the caller's piece buffers. Shared by the
// in-process reshard (reshard/offline_reshard.h) and the worker daemon's reshard parts.
#ifndef CKPT_RESHARD_PIECE_ASSEMBLER_H_
#define CKPT_RESHARD_PIECE_ASSEMBLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"
#include "sharding/layout.h"
#include "sharding/reshard_plan.h"
#include "sharding/tensor_meta.h"
#include "storage/checkpoint_reader.h"
#include "storage/stage_pipeline.h"

namespace ckpt {

// A committed checkpoint's tensors and stored pieces, as the reshard planner sees them.
struct SourcePieces {
  std::vector<TensorMeta> tensors;  // manifest order
  std::vector<TensorPiece> pieces;  // manifest order; rank = the piece's writer rank
};

// The tensors and pieces of a manifest (validated, e.g. by CheckpointReader::Open).
// InvalidArgument naming the key for an unknown dtype or a piece of an unknown tensor.
absl::StatusOr<SourcePieces> PiecesOfManifest(const pb::Manifest& manifest);

// Counters of what an assembler read.
struct AssemblyStats {
  int64_t bytes_read = 0;           // source bytes read (whole checksum blocks)
  int64_t peak_staging_bytes = 0;   // both staging slots
  int64_t staging_allocations = 0;  // times a staging slot had to grow (not once per batch)
  int64_t batches = 0;              // read batches
  double read_seconds = 0;          // in reads (overlapping the copies of the batch before)
};

// Fills destination pieces from the source checkpoint. Not thread-safe. Reads batches into two
// staging slots of at most `staging_cap` / 2 bytes each (a span of a source piece may need a
// whole checksum block more per slot), reused by every batch and every Fill: batch k + 1 is
// read while batch k is copied into the destination buffers (storage/stage_pipeline.h).
class PieceAssembler {
 public:
  // `reader` is the open source checkpoint, `src` its pieces (PiecesOfManifest), `dst` the
  // destination pieces and `plan` = PlanReshard(src, dst). All must outlive the assembler.
  PieceAssembler(const CheckpointReader& reader, const std::vector<TensorPiece>& src,
                 const std::vector<TensorPiece>& dst, const ReshardPlan& plan, int64_t staging_cap,
                 bool overlap = true);

  // Fills buffers[i] (dst[pieces[i]]'s bytes, storage convention of sharding/overlap.h) with
  // the source elements. DataLoss/NotFound from the reader name the checkpoint and file;
  // NotFound (a hole) or DataLoss (an overlap) naming the piece when the plan's runs do not
  // write every element of a buffer exactly once (checked before anything is read).
  absl::Status Fill(absl::Span<const int64_t> pieces, absl::Span<char* const> buffers);

  const AssemblyStats& stats() const { return stats_; }

 private:
  // One byte run to copy out of a source piece: source bytes [src, src + bytes) -> dst.
  struct ByteJob {
    int64_t src = 0;
    int64_t bytes = 0;
    char* dst = nullptr;
  };
  // A block-aligned span of a source piece to read.
  struct SpanRead {
    int piece = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  // Block-aligned spans of each source piece that `jobs` (sorted here by source offset) need,
  // in chunks of at most `slot_cap` bytes (a block at least) the I/O threads can share.
  std::vector<SpanRead> SpansOf(std::map<int, std::vector<ByteJob>>* jobs, int64_t slot_cap) const;
  // Reads the spans into staging slot `slot`; *reads gets where each landed.
  absl::Status ReadBatch(absl::Span<const SpanRead> spans, int slot, std::vector<PieceRead>* reads);
  // Copies what ReadBatch read for `spans` into the destination buffers of `jobs`.
  static void CopyOut(absl::Span<const SpanRead> spans, const std::vector<PieceRead>& reads,
                      const std::map<int, std::vector<ByteJob>>& jobs);

  const CheckpointReader& reader_;
  const std::vector<TensorPiece>& src_;
  const std::vector<TensorPiece>& dst_;
  const ReshardPlan& plan_;
  const int64_t staging_cap_;
  const bool overlap_;  // read batch k + 1 while batch k is copied out
  std::map<int64_t, std::pair<int64_t, int64_t>> transfers_of_;  // dst piece -> [first, last)
  ReusedBuffer staging_[2];                                      // reused by every batch
  AssemblyStats stats_;
};

}  // namespace ckpt

#endif  // CKPT_RESHARD_PIECE_ASSEMBLER_H_
