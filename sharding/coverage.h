// Exact coverage: do a tensor's stored pieces hold every element exactly once? Counting
// elements cannot tell (an overlap hides a hole of the same size), so this checks the tiling
// itself, in O(T log T) for T "corner terms" (at most 2^k per box cut along k dimensions;
// a flat piece is at most 2d - 1 boxes), and names the first element stored zero or several
// times. Also: the exact tiling of a buffer by copy runs, for code that assembles one.
// Pure: no I/O.
//
// Why it is exact: a box [a, b) is the signed sum over its corners c of the orthant indicator
// [x >= c] (sign -1 per coordinate taken from b; corners with a coordinate at the tensor's end
// vanish inside the tensor). The pieces tile the tensor iff their signed corner terms sum to
// the tensor's single term at the origin. Otherwise the row-major smallest point with a
// non-zero sum is the first element stored (1 + sum) times.
#ifndef CKPT_SHARDING_COVERAGE_H_
#define CKPT_SHARDING_COVERAGE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/region.h"

namespace ckpt {

// The first (row-major) element of a tensor not stored exactly once.
struct CoverageFault {
  int64_t first = 0;             // its row-major index
  std::vector<int64_t> element;  // its coordinates
  int64_t copies = 0;            // pieces storing it: 0 for a hole, >= 2 for an overlap
  // A hole: the run of missing elements [first, end) in row-major order. An overlap: first + 1.
  int64_t end = 0;
  // An overlap: indices (into the pieces given) of two pieces that both store the element.
  std::vector<int> pieces;
};

// Terms the check may use for `num_pieces` pieces: 128 per piece plus 4 Mi (a box cut along 4
// dims needs 16, a flat piece of a 4-d box at most 112; memory stays within a small multiple
// of the manifest's own).
int64_t CoverageTermBudget(int64_t num_pieces);

// Checks that `pieces` (each valid for `shape`: ValidateRegion) store every element exactly
// once. nullopt when they tile the tensor, else the first element stored zero or several
// times. ResourceExhausted when the pieces are cut along so many dimensions that the check
// would need more than `max_terms` terms.
absl::StatusOr<std::optional<CoverageFault>> FindCoverageFault(absl::Span<const int64_t> shape,
                                                               absl::Span<const Region> pieces,
                                                               int64_t max_terms);

// E.g. `tensor "w" (8, 6): elements [12, 18) (row-major; the first is (2, 0)) are stored by no
// piece` or `tensor "w" (8, 6): element (3, 0) is stored by 2 pieces: <a> and <b>`, where
// `piece_name(i)` describes piece i.
std::string DescribeCoverageFault(absl::string_view key, absl::Span<const int64_t> shape,
                                  const CoverageFault& fault,
                                  const std::function<std::string(int)>& piece_name);

// The exact check for one tensor as a status: OK, or DataLoss with DescribeCoverageFault
// (piece names: their regions) or the check's own error.
absl::Status CheckExactCoverage(absl::string_view key, absl::Span<const int64_t> shape,
                                absl::Span<const Region> pieces);

// Where runs (offset, length) fail to tile [0, total) exactly: the first offset not written
// once. `hole` tells a gap [offset, end) from an overlap (or a run past the end) at offset.
struct RunFault {
  bool hole = false;
  int64_t offset = 0;
  int64_t end = 0;
};
std::optional<RunFault> FindRunTilingFault(std::vector<std::pair<int64_t, int64_t>> runs,
                                           int64_t total);

// "elements [12, 18) of <what> are assembled from no stored piece" / "element 12 of <what> is
// assembled from more than one stored piece" as NotFound / DataLoss, or OK without a fault.
absl::Status RunTilingStatus(const std::optional<RunFault>& fault, absl::string_view what);

}  // namespace ckpt

#endif  // CKPT_SHARDING_COVERAGE_H_
