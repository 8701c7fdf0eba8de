#include "coordinator/layout_spec.h"

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "sharding/flat_sharding.h"

namespace ckpt {
namespace {

// Keeps the order of "mesh" entries as written (it defines rank numbering).
using Json = nlohmann::ordered_json;

absl::Status PathError(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("layout ", path, ": ", message));
}

std::string TypeName(const Json& j) { return j.type_name(); }

// Rejects keys other than `allowed` (and "comment") in an object.
absl::Status CheckKeys(const Json& object, const std::string& path,
                       std::initializer_list<const char*> allowed) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = it.key() == "comment";
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      return PathError(path.empty() ? it.key() : absl::StrCat(path, ".", it.key()),
                       absl::StrCat("unknown field (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PositiveInt(const Json& j, const std::string& path) {
  if (!j.is_number_integer() || j.get<int64_t>() < 1) {
    return PathError(path, absl::StrCat("expected an integer >= 1, got ", j.dump()));
  }
  return j.get<int64_t>();
}

// Glob matcher with backtracking over the last '*'.
bool MatchClass(absl::string_view pattern, size_t* i, char c, bool* valid) {
  // pattern[*i] == '['; on return *i is past the closing ']'.
  size_t j = *i + 1;
  bool negate = false;
  if (j < pattern.size() && (pattern[j] == '!' || pattern[j] == '^')) {
    negate = true;
    ++j;
  }
  bool matched = false;
  bool first = true;
  while (j < pattern.size() && (first || pattern[j] != ']')) {
    first = false;
    char lo = pattern[j], hi = lo;
    if (j + 2 < pattern.size() && pattern[j + 1] == '-' && pattern[j + 2] != ']') {
      hi = pattern[j + 2];
      j += 2;
    }
    if (lo <= c && c <= hi) matched = true;
    ++j;
  }
  if (j >= pattern.size()) {
    *valid = false;  // no closing ']': treat '[' literally
    return c == '[';
  }
  *valid = true;
  *i = j + 1;
  return matched != negate;
}

}  // namespace

bool GlobMatch(absl::string_view pattern, absl::string_view text) {
  size_t p = 0, t = 0;
  size_t star_p = absl::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_t = t;
      continue;
    }
    if (p < pattern.size()) {
      if (pattern[p] == '?') {
        ++p;
        ++t;
        continue;
      }
      if (pattern[p] == '[') {
        size_t q = p;
        bool valid = false;
        if (MatchClass(pattern, &q, text[t], &valid)) {
          p = valid ? q : p + 1;
          ++t;
          continue;
        }
      } else if (pattern[p] == text[t]) {
        ++p;
        ++t;
        continue;
      }
    }
    if (star_p == absl::string_view::npos) return false;
    p = star_p + 1;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<Placement> ParsePlacement(absl::string_view text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  if (s == "Replicate()") return Placement::Replicate();
  absl::string_view v = s;
  if (absl::ConsumePrefix(&v, "Shard(") && absl::ConsumeSuffix(&v, ")")) {
    absl::ConsumePrefix(&v, "dim=");
    int dim = 0;
    if (!v.empty() && absl::SimpleAtoi(v, &dim)) return Placement::Shard(dim);
  }
  return std::nullopt;
}

bool LayoutRule::Matches(absl::string_view key) const {
  if (is_regex) {
    return std::regex_match(key.begin(), key.end(), *regex);
  }
  return GlobMatch(pattern, key);
}

absl::StatusOr<LayoutSpec> LayoutSpec::Parse(absl::string_view json_text) {
  const Json root = Json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return PathError("(document)", "not valid JSON");
  if (!root.is_object()) return PathError("(document)", "expected an object");
  CKPT_RETURN_IF_ERROR(CheckKeys(root, "", {"world_size", "mesh", "rules"}));

  // mesh: {"tp": 2, "dp": 2} in rank-major order.
  if (!root.contains("mesh")) return PathError("mesh", "missing");
  const Json& mesh_json = root["mesh"];
  if (!mesh_json.is_object() || mesh_json.empty()) {
    return PathError("mesh", absl::StrCat("expected a non-empty object of dim name -> size, got ",
                                          TypeName(mesh_json)));
  }
  std::vector<std::string> names;
  std::vector<int64_t> shape;
  for (auto it = mesh_json.begin(); it != mesh_json.end(); ++it) {
    const std::string path = absl::StrCat("mesh.", it.key());
    if (it.key().empty()) return PathError(path, "empty dim name");
    CKPT_ASSIGN_OR_RETURN(int64_t size, PositiveInt(it.value(), path));
    names.push_back(it.key());
    shape.push_back(size);
  }
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape);
  if (!mesh.ok()) return PathError("mesh", mesh.status().message());
  if (root.contains("world_size")) {
    CKPT_ASSIGN_OR_RETURN(int64_t world, PositiveInt(root["world_size"], "world_size"));
    if (world != mesh->size()) {
      return PathError("world_size",
                       absl::StrCat(world, " does not equal the mesh's ", mesh->size(), " ranks (",
                                    ShapeString(shape), ")"));
    }
  }
  LayoutSpec spec(*std::move(mesh));
  spec.dim_names_ = names;

  if (!root.contains("rules")) return PathError("rules", "missing");
  const Json& rules = root["rules"];
  if (!rules.is_array() || rules.empty()) {
    return PathError("rules", "expected a non-empty array of rules");
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    const std::string rpath = absl::StrCat("rules[", r, "]");
    const Json& rj = rules[r];
    if (!rj.is_object()) return PathError(rpath, "expected an object");
    CKPT_RETURN_IF_ERROR(CheckKeys(rj, rpath, {"match", "regex", "placements", "flat"}));
    LayoutRule rule;
    if (rj.contains("match") == rj.contains("regex")) {
      return PathError(rpath, "needs exactly one of \"match\" (glob) or \"regex\"");
    }
    const char* pattern_field = rj.contains("match") ? "match" : "regex";
    const std::string ppath = absl::StrCat(rpath, ".", pattern_field);
    if (!rj[pattern_field].is_string() || rj[pattern_field].get<std::string>().empty()) {
      return PathError(ppath, "expected a non-empty string");
    }
    rule.pattern = rj[pattern_field].get<std::string>();
    rule.is_regex = rj.contains("regex");
    if (rule.is_regex) {
      try {
        rule.regex = std::make_shared<const std::regex>(rule.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return PathError(ppath, absl::StrCat("invalid regex \"", rule.pattern, "\": ", e.what()));
      }
    }
    if (rj.contains("flat")) {
      const std::string fpath = absl::StrCat(rpath, ".flat");
      const Json& fj = rj["flat"];
      if (!fj.is_object()) return PathError(fpath, "expected {\"over\": \"<mesh dim>\"}");
      CKPT_RETURN_IF_ERROR(CheckKeys(fj, fpath, {"over"}));
      if (!fj.contains("over") || !fj["over"].is_string()) {
        return PathError(fpath + ".over", "expected the name of a mesh dim");
      }
      const std::string over = fj["over"].get<std::string>();
      for (size_t d = 0; d < names.size(); ++d) {
        if (names[d] == over) rule.flat_dim = static_cast<int>(d);
      }
      if (!rule.flat_dim) {
        return PathError(fpath + ".over", absl::StrCat("\"", over, "\" is not a mesh dim (",
                                                       absl::StrJoin(names, ", "), ")"));
      }
    }
    if (rj.contains("placements")) {
      const std::string lpath = absl::StrCat(rpath, ".placements");
      const Json& pj = rj["placements"];
      if (!pj.is_array() || pj.size() != names.size()) {
        return PathError(lpath, absl::StrCat("expected an array of ", names.size(),
                                             " placements, one per mesh dim (",
                                             absl::StrJoin(names, ", "), ")"));
      }
      for (size_t d = 0; d < pj.size(); ++d) {
        const std::string epath = absl::StrCat(lpath, "[", d, "]");
        std::optional<Placement> p;
        if (pj[d].is_string()) p = ParsePlacement(pj[d].get<std::string>());
        if (!p) {
          return PathError(epath, absl::StrCat("unknown placement ", pj[d].dump(),
                                               " (expected \"Shard(<dim>)\" or \"Replicate()\")"));
        }
        if (rule.flat_dim && static_cast<int>(d) == *rule.flat_dim && p->is_shard()) {
          return PathError(epath, absl::StrCat("mesh dim \"", names[d],
                                               "\" carries the flat sharding; its box placement "
                                               "must be \"Replicate()\""));
        }
        rule.placements.push_back(*p);
      }
    } else if (rule.flat_dim) {
      rule.placements.assign(names.size(), Placement::Replicate());
    } else {
      return PathError(rpath, "needs \"placements\" and/or \"flat\"");
    }
    spec.rules_.push_back(std::move(rule));
  }
  return spec;
}

absl::StatusOr<LayoutSpec> LayoutSpec::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open layout file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<LayoutSpec> spec = Parse(buffer.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

absl::StatusOr<const LayoutRule*> LayoutSpec::RuleFor(absl::string_view key) const {
  for (const LayoutRule& rule : rules_) {
    if (rule.Matches(key)) return &rule;
  }
  return absl::NotFoundError(absl::StrCat("tensor \"", key, "\" matches no rule of the layout (",
                                          rules_.size(), " rules); add a rule for it"));
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::PiecesOf(const TensorMeta& tensor) const {
  CKPT_ASSIGN_OR_RETURN(const LayoutRule* rule, RuleFor(tensor.key));
  auto context = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.key, "\" ", ShapeString(tensor.global_shape),
                     " under rule \"", rule->pattern, "\" ", PlacementsString(rule->placements),
                     rule->flat_dim ? absl::StrCat(" flat over ", dim_names_[*rule->flat_dim]) : "",
                     ": ", s.message()));
  };
  absl::StatusOr<std::vector<LocalShard>> shards =
      ComputeAllLocalShards(tensor.global_shape, mesh_, rule->placements);
  if (!shards.ok()) return context(shards.status());
  std::vector<TensorPiece> pieces;
  pieces.reserve(shards->size());
  for (int64_t rank = 0; rank < mesh_.size(); ++rank) {
    const LocalShard& shard = (*shards)[rank];
    CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> coord, mesh_.Coordinate(rank));
    TensorPiece piece;
    piece.key = tensor.key;
    piece.rank = rank;
    piece.dtype = tensor.dtype;
    piece.global_shape = tensor.global_shape;
    piece.region = shard.region();
    for (int d = 0; d < mesh_.ndim(); ++d) {
      if (!rule->placements[d].is_shard() && (!rule->flat_dim || d != *rule->flat_dim)) {
        piece.replica_id.push_back(coord[d]);
      }
    }
    if (rule->flat_dim) {
      const int64_t parts = mesh_.shape()[*rule->flat_dim];
      absl::StatusOr<FlatShardingSpec> flat =
          EvenFlatSharding(shard.shape, static_cast<int>(parts));
      if (!flat.ok()) return context(flat.status());
      const auto& ranges = flat->unsharded_flattened_offsets[coord[*rule->flat_dim]];
      piece.region.flat = ranges.empty()
                              ? FlatRange{piece.region.BoxElements(), piece.region.BoxElements()}
                              : ranges.front();
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::AllPieces(absl::Span<const TensorMeta> tensors,
                                                               bool drop_empty) const {
  std::vector<TensorPiece> out;
  for (const TensorMeta& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(std::vector<TensorPiece> pieces, PiecesOf(t));
    for (TensorPiece& p : pieces) {
      if (drop_empty && p.region.NumElements() == 0) continue;
      out.push_back(std::move(p));
    }
  }
  return out;
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::RankPieces(
    absl::Span<const TensorMeta> tensors, int64_t rank) const {
  if (rank < 0 || rank >= mesh_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the layout's ", mesh_.size(), " ranks"));
  }
  std::vector<TensorPiece> out;
  for (const TensorMeta& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(std::vector<TensorPiece> pieces, PiecesOf(t));
    out.push_back(std::move(pieces[rank]));
  }
  return out;
}

absl::StatusOr<pb::SavedLayout> LayoutSpec::ToSavedLayout(
    absl::Span<const TensorMeta> tensors) const {
  pb::SavedLayout layout;
  layout.set_world_size(static_cast<int32_t>(mesh_.size()));
  for (int64_t d : mesh_.shape()) layout.add_mesh_shape(d);
  for (const TensorMeta& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(const LayoutRule* rule, RuleFor(t.key));
    pb::TensorLayout* tl = layout.add_tensors();
    tl->set_key(t.key);
    for (const Placement& p : rule->placements) {
      pb::Placement* pp = tl->add_placements();
      if (p.is_shard()) {
        pp->set_shard_dim(p.dim);
      } else {
        pp->set_replicate(true);
      }
    }
    tl->set_flat_sharded(rule->flat_dim.has_value());
  }
  return layout;
}

}  // namespace ckpt
