// A target layout described in JSON (docs/layout.md): a device mesh with named dims and, per
// tensor-name pattern (first matching rule wins), DTensor placements per mesh dim, optionally
// with ZeRO/FSDP-style flat sharding of each box over one mesh dim. From the tensors' metadata
// it yields every rank's pieces (region, flat range, replica id), e.g. as the destination of
// an offline reshard or the layout an example trainer holds.
//
// A layout is untrusted input (it arrives over gRPC at the coordinator): it is bounded before
// any DOM or per-rank state is built (the limits below, docs/layout.md "Limits"), and its
// patterns are matched with RE2, in time linear in the key and without recursion.
#ifndef CKPT_PLANNER_LAYOUT_SPEC_H_
#define CKPT_PLANNER_LAYOUT_SPEC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/process_groups.h"
#include "proto/types.pb.h"
#include "sharding/dtensor.h"
#include "sharding/layout.h"
#include "sharding/tensor_meta.h"

namespace re2 {
class RE2;
}  // namespace re2

namespace ckpt {

// Limits on a layout; each is named in the error that refuses it.
inline constexpr int64_t kMaxLayoutBytes = int64_t{1} << 20;  // the JSON text
inline constexpr int kMaxLayoutJsonDepth = 16;                // arrays/objects open at once
inline constexpr int kMaxMeshDims = 16;
inline constexpr int kMaxMeshDimNameBytes = 64;
// RE2 matches in O(key length x pattern length) at worst and keeps at most max_mem per
// compiled pattern (program and DFA caches): these bound a layout's matching to about
// 256 MiB and, per key of n bytes, 256 x 1024 x n steps.
inline constexpr int kMaxLayoutRules = 256;
inline constexpr int kMaxPatternBytes = 1024;                   // one "match" or "regex"
inline constexpr int64_t kMaxPatternMemory = int64_t{1} << 20;  // RE2 max_mem per pattern
// Pieces expanded at once (tensors x ranks in AllPieces): about 300 bytes each.
inline constexpr int64_t kMaxLayoutPieces = int64_t{1} << 24;
// The world size (product of the mesh dims) is at most kMaxWorldSize (sharding/dtensor.h).

// One rule: which tensors it covers and how they are laid out.
struct LayoutRule {
  std::string pattern;    // as written in the JSON
  bool is_regex = false;  // RE2 regex (full match) instead of a glob
  // The compiled pattern: the regex, or the glob translated to an RE2 over bytes (Latin-1).
  std::shared_ptr<const re2::RE2> matcher;
  // One per mesh dim. With flat_dim set, the entry at *flat_dim is Replicate(): the box is
  // whole along that mesh dim and then split into even flat ranges over it.
  std::vector<Placement> placements;
  std::optional<int> flat_dim;  // mesh dim index of "flat": {"over": ...}

  bool Matches(absl::string_view key) const;
};

// A parsed, validated layout.
class LayoutSpec {
 public:
  // Parses the JSON text. Errors are InvalidArgument naming the JSON path, e.g.
  // "rules[2].placements[1]: unknown placement \"Shard(x)\"", or the limit exceeded.
  static absl::StatusOr<LayoutSpec> Parse(absl::string_view json_text);
  // Reads and parses a file (a regular file of at most kMaxLayoutBytes); errors name it.
  static absl::StatusOr<LayoutSpec> FromFile(const std::string& path);
  // The text of a layout file, unparsed (e.g. to send it to a coordinator), with FromFile's
  // checks: a regular file of at most kMaxLayoutBytes.
  static absl::StatusOr<std::string> ReadFile(const std::string& path);

  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  int64_t world_size() const { return mesh_.size(); }
  const std::vector<LayoutRule>& rules() const { return rules_; }
  // The layout's process groups (planner/layout_groups.h); empty: none declared (one group).
  const ProcessGroups& process_groups() const { return process_groups_; }

  // The first rule matching `key`, or NotFound naming the key.
  absl::StatusOr<const LayoutRule*> RuleFor(absl::string_view key) const;

  // Every rank's piece of one tensor, by rank (one piece per rank; pieces of a flat rule may
  // hold an empty flat range). Errors name the tensor, rule and placements.
  absl::StatusOr<std::vector<TensorPiece>> PiecesOf(const TensorMeta& tensor) const;

  // Pieces of all tensors (tensor order, then rank). With `drop_empty`, pieces holding no
  // element are left out. More than kMaxLayoutPieces tensors x ranks is InvalidArgument.
  absl::StatusOr<std::vector<TensorPiece>> AllPieces(absl::Span<const TensorMeta> tensors,
                                                     bool drop_empty = false) const;

  // The pieces `rank` holds, in tensor order (empty ones included); O(tensors), whatever
  // the world size.
  absl::StatusOr<std::vector<TensorPiece>> RankPieces(absl::Span<const TensorMeta> tensors,
                                                      int64_t rank) const;

  // The manifest's record of this layout for the given tensors.
  absl::StatusOr<pb::SavedLayout> ToSavedLayout(absl::Span<const TensorMeta> tensors) const;

 private:
  explicit LayoutSpec(DeviceMesh mesh) : mesh_(std::move(mesh)) {}
  // The piece `rank` (at mesh coordinate `coord`) holds of `tensor` under `rule`, given the
  // rank's DTensor shard.
  absl::StatusOr<TensorPiece> PieceAt(const TensorMeta& tensor, const LayoutRule& rule,
                                      int64_t rank, absl::Span<const int64_t> coord,
                                      const LocalShard& shard) const;
  // Appends every rank's piece of `tensor` (rank order; with `drop_empty`, non-empty ones).
  absl::Status AppendPieces(const TensorMeta& tensor, bool drop_empty,
                            std::vector<TensorPiece>* out) const;
  // An error about `tensor` under `rule`, with both named.
  absl::Status TensorError(const TensorMeta& tensor, const LayoutRule& rule,
                           const absl::Status& cause) const;

  DeviceMesh mesh_;
  std::vector<std::string> dim_names_;
  std::vector<LayoutRule> rules_;
  ProcessGroups process_groups_;
};

// fnmatch-style glob over bytes: '*' any run of bytes (dots included), '?' one byte,
// '[abc]' / '[a-z]' / '[!a]' a class (byte values; a '[' without a closing ']' is literal).
// Whole-string match. The straightforward backtracking twin of the RE2 translation that
// layouts use (worst case O(pattern x text)).
bool GlobMatch(absl::string_view pattern, absl::string_view text);

namespace internal {
// The RE2 pattern (Latin-1 encoding, dot_nl) matching exactly what GlobMatch(glob, .) does.
std::string GlobToRe2Pattern(absl::string_view glob);
}  // namespace internal

// "Shard(0)", "Shard(-1)", "Replicate()" (spaces allowed, as DTensor prints them), else nullopt.
std::optional<Placement> ParsePlacement(absl::string_view text);

}  // namespace ckpt

#endif  // CKPT_PLANNER_LAYOUT_SPEC_H_
