// A target layout described in JSON (docs/layout.md): a device mesh with named dims and, per
// tensor-name pattern (first matching rule wins), DTensor placements per mesh dim, optionally
// with ZeRO/FSDP-style flat sharding of each box over one mesh dim. From the tensors' metadata
// it yields every rank's pieces (region, flat range, replica id), e.g. as the destination of
// an offline reshard or the layout an example trainer holds.
#ifndef CKPT_COORDINATOR_LAYOUT_SPEC_H_
#define CKPT_COORDINATOR_LAYOUT_SPEC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/types.pb.h"
#include "sharding/dtensor.h"
#include "sharding/layout.h"
#include "sharding/tensor_meta.h"

namespace ckpt {

// One rule: which tensors it covers and how they are laid out.
struct LayoutRule {
  std::string pattern;                      // as written in the JSON
  bool is_regex = false;                    // regex (full match, ECMAScript) instead of a glob
  std::shared_ptr<const std::regex> regex;  // compiled when is_regex
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
  // "rules[2].placements[1]: unknown placement \"Shard(x)\"".
  static absl::StatusOr<LayoutSpec> Parse(absl::string_view json_text);
  // Reads and parses a file; errors name the file.
  static absl::StatusOr<LayoutSpec> FromFile(const std::string& path);

  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  int64_t world_size() const { return mesh_.size(); }
  const std::vector<LayoutRule>& rules() const { return rules_; }

  // The first rule matching `key`, or NotFound naming the key.
  absl::StatusOr<const LayoutRule*> RuleFor(absl::string_view key) const;

  // Every rank's piece of one tensor, by rank (one piece per rank; pieces of a flat rule may
  // hold an empty flat range). Errors name the tensor, rule and placements.
  absl::StatusOr<std::vector<TensorPiece>> PiecesOf(const TensorMeta& tensor) const;

  // Pieces of all tensors (tensor order, then rank). With `drop_empty`, pieces holding no
  // element are left out.
  absl::StatusOr<std::vector<TensorPiece>> AllPieces(absl::Span<const TensorMeta> tensors,
                                                     bool drop_empty = false) const;

  // The pieces `rank` holds, in tensor order (empty ones included).
  absl::StatusOr<std::vector<TensorPiece>> RankPieces(absl::Span<const TensorMeta> tensors,
                                                      int64_t rank) const;

  // The manifest's record of this layout for the given tensors.
  absl::StatusOr<pb::SavedLayout> ToSavedLayout(absl::Span<const TensorMeta> tensors) const;

 private:
  LayoutSpec(DeviceMesh mesh) : mesh_(std::move(mesh)) {}
  DeviceMesh mesh_;
  std::vector<std::string> dim_names_;
  std::vector<LayoutRule> rules_;
};

// fnmatch-style glob: '*' any run of characters (dots included), '?' one character,
// '[abc]' / '[a-z]' / '[!a]' a class. Whole-string match.
bool GlobMatch(absl::string_view pattern, absl::string_view text);

// "Shard(0)", "Shard(-1)", "Replicate()" (spaces allowed, as DTensor prints them), else nullopt.
std::optional<Placement> ParsePlacement(absl::string_view text);

}  // namespace ckpt

#endif  // CKPT_COORDINATOR_LAYOUT_SPEC_H_
