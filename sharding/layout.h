// Validation of a tensor's layout across ranks: given every rank's pieces, check that they
// agree on dtype and global shape, that their regions are valid, that main replicas (replica
// id all zeros) never overlap and that they cover every element (no holes).
#ifndef CKPT_SHARDING_LAYOUT_H_
#define CKPT_SHARDING_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/region.h"

namespace ckpt {

// One rank's piece of one tensor, as gathered from all ranks.
struct TensorPiece {
  std::string key;
  int64_t rank = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  Region region;
  std::vector<int64_t> replica_id;  // all zeros (or empty) marks the main replica

  bool is_main_replica() const;
  // E.g. "rank 3 [0:4, 8:16] replica (0, 1)".
  std::string DebugString() const;
};

// One problem found in a layout.
struct LayoutIssue {
  enum class Kind { kDTypeMismatch, kShapeMismatch, kInvalidRegion, kOverlap, kHole };
  Kind kind;
  std::string message;  // names the tensor, ranks and regions
};

// Checks one tensor's pieces (all with the same key). Reference dtype and shape are those of
// the lowest rank. Pieces whose dtype, shape or region is wrong are left out of the overlap
// and hole checks. Holes are only counted when the main replicas do not overlap; the first
// hole element (row-major) is named. Reports at most `max_issues` issues. Cost:
// O((p + k) log p) for p pieces and k overlapping pairs (plus p per hole-search step).
std::vector<LayoutIssue> CheckTensorLayout(absl::Span<const TensorPiece> pieces,
                                           int max_issues = 16);

// The same, over pointers to pieces kept elsewhere (no copies).
std::vector<LayoutIssue> CheckTensorLayout(absl::Span<const TensorPiece* const> pieces,
                                           int max_issues = 16);

// OK when `messages` (the issues found, at most `max_issues`) is empty, else InvalidArgument
// "invalid layout (N[+] issues): ..." listing them ("+": the search stopped at `max_issues`).
absl::Status LayoutIssuesStatus(absl::Span<const std::string> messages, int max_issues);

// OK, or InvalidArgument listing the issues of every tensor (pieces are grouped by key).
absl::Status ValidateLayout(absl::Span<const TensorPiece> pieces, int max_issues = 16);

}  // namespace ckpt

#endif  // CKPT_SHARDING_LAYOUT_H_
