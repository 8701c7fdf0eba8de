#include "planner/layout_spec.h"

#include <sys/stat.h>

#include <bitset>
#include <cctype>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/json_guard.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "planner/layout_groups.h"
#include "re2/re2.h"
#include "sharding/flat_sharding.h"

namespace ckpt {
namespace {

// Keeps the order of "mesh" entries as written (it defines rank numbering).
using Json = nlohmann::ordered_json;

// Longest piece of untrusted text (a pattern, a key, a string value) quoted in an error.
constexpr size_t kMaxQuoted = 200;

absl::Status PathError(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("layout ", path, ": ", message));
}

std::string Quoted(absl::string_view text) {
  if (text.size() <= kMaxQuoted) return absl::StrCat("\"", absl::Utf8SafeCHexEscape(text), "\"");
  return absl::StrCat("\"", absl::Utf8SafeCHexEscape(text.substr(0, kMaxQuoted)), "\"... (",
                      text.size(), " bytes)");
}

// A short description of a JSON value for an error: scalars as written, strings quoted (and
// cut), arrays and objects by type only (they may be large).
std::string Describe(const Json& j) {
  if (j.is_string()) return Quoted(j.get_ref<const std::string&>());
  if (j.is_primitive()) return j.dump();
  return j.type_name();
}

// An object key as part of a JSON path in an error: cut, and escaped when not printable.
std::string PathKey(absl::string_view key) {
  constexpr size_t kMaxKey = 64;
  std::string out = absl::CHexEscape(key.substr(0, kMaxKey));
  if (key.size() > kMaxKey) absl::StrAppend(&out, "... (", key.size(), " bytes)");
  return out;
}

// Rejects keys other than `allowed` (and "comment") in an object.
absl::Status CheckKeys(const Json& object, const std::string& path,
                       std::initializer_list<const char*> allowed) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = it.key() == "comment";
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      return PathError(
          path.empty() ? PathKey(it.key()) : absl::StrCat(path, ".", PathKey(it.key())),
          absl::StrCat("unknown field (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// An integer in [1, max]; `max` names the limit in the error.
absl::StatusOr<int64_t> PositiveInt(const Json& j, const std::string& path, int64_t max) {
  if (!j.is_number_integer()) {
    return PathError(path, absl::StrCat("expected an integer >= 1, got ", Describe(j)));
  }
  if (j.is_number_unsigned() ? j.get<uint64_t>() > static_cast<uint64_t>(max)
                             : j.get<int64_t>() > max) {
    return PathError(path, absl::StrCat(j.dump(), " is more than the limit of ", max));
  }
  if (j.get<int64_t>() < 1) {
    return PathError(path, absl::StrCat("expected an integer >= 1, got ", j.dump()));
  }
  return j.get<int64_t>();
}

// The set of bytes a glob class starting at pattern[*i] == '[' matches; on success *i is
// past the closing ']'. nullopt when there is no closing ']' (the '[' is then literal).
// Same grammar as GlobMatch's: optional '!' or '^', a leading ']' is a member, "a-z" ranges.
std::optional<std::bitset<256>> ParseClass(absl::string_view pattern, size_t* i) {
  size_t j = *i + 1;
  bool negate = false;
  if (j < pattern.size() && (pattern[j] == '!' || pattern[j] == '^')) {
    negate = true;
    ++j;
  }
  std::bitset<256> members;
  bool first = true;
  while (j < pattern.size() && (first || pattern[j] != ']')) {
    first = false;
    const unsigned char lo = pattern[j];
    unsigned char hi = lo;
    if (j + 2 < pattern.size() && pattern[j + 1] == '-' && pattern[j + 2] != ']') {
      hi = pattern[j + 2];
      j += 2;
    }
    for (int c = lo; c <= hi; ++c) members.set(c);
    ++j;
  }
  if (j >= pattern.size()) return std::nullopt;
  *i = j + 1;
  return negate ? ~members : members;
}

std::string ByteRe2(unsigned char c) { return absl::StrCat("\\x{", absl::Hex(c), "}"); }

std::string ClassRe2(const std::bitset<256>& members) {
  if (members.none()) return "[^\\x00-\\x{ff}]";  // matches no byte
  std::string out = "[";
  for (int c = 0; c < 256;) {
    if (!members.test(c)) {
      ++c;
      continue;
    }
    int end = c;
    while (end + 1 < 256 && members.test(end + 1)) ++end;
    absl::StrAppend(&out, ByteRe2(c), end > c ? absl::StrCat("-", ByteRe2(end)) : "");
    c = end + 1;
  }
  return out + "]";
}

}  // namespace

namespace internal {

std::string GlobToRe2Pattern(absl::string_view glob) {
  std::string out;
  for (size_t p = 0; p < glob.size();) {
    if (glob[p] == '*') {
      if (!absl::EndsWith(out, ".*")) out += ".*";  // runs of '*' are one
      ++p;
    } else if (glob[p] == '?') {
      out += ".";
      ++p;
    } else if (std::optional<std::bitset<256>> members;
               glob[p] == '[' && (members = ParseClass(glob, &p))) {
      out += ClassRe2(*members);
    } else {
      out += ByteRe2(glob[p]);
      ++p;
    }
  }
  return out;
}

}  // namespace internal

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
        std::optional<std::bitset<256>> members = ParseClass(pattern, &q);
        if (!members) {
          if (text[t] == '[') {  // no closing ']': a literal '['
            ++p;
            ++t;
            continue;
          }
        } else if (members->test(static_cast<unsigned char>(text[t]))) {
          p = q;
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
  return RE2::FullMatch(re2::StringPiece(key.data(), key.size()), *matcher);
}

namespace {

// Compiles a rule's pattern (a regex, or a glob translated to RE2) within the limits.
absl::StatusOr<std::shared_ptr<const re2::RE2>> CompilePattern(const std::string& pattern,
                                                               bool is_regex,
                                                               const std::string& path) {
  if (pattern.empty()) return PathError(path, "expected a non-empty string");
  if (pattern.size() > static_cast<size_t>(kMaxPatternBytes)) {
    return PathError(path, absl::StrCat("pattern of ", pattern.size(),
                                        " bytes, more than the limit of ", kMaxPatternBytes));
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kMaxPatternMemory);
  options.set_never_capture(true);
  if (!is_regex) {
    options.set_encoding(RE2::Options::EncodingLatin1);  // globs match bytes
    options.set_dot_nl(true);
  }
  auto re = std::make_shared<const re2::RE2>(
      is_regex ? pattern : internal::GlobToRe2Pattern(pattern), options);
  if (!re->ok()) {
    std::string why = re->error();
    if (why.size() > kMaxQuoted) why = why.substr(0, kMaxQuoted) + "...";
    return PathError(path, absl::StrCat(is_regex ? "invalid regex " : "cannot compile the glob ",
                                        Quoted(pattern), ": ", why,
                                        is_regex ? " (RE2 syntax, see docs/layout.md)" : ""));
  }
  return re;
}

// "mesh": {"tp": 2, "dp": 2} in rank-major order.
absl::Status ParseMesh(const Json& root, std::vector<std::string>* names,
                       std::vector<int64_t>* shape) {
  if (!root.contains("mesh")) return PathError("mesh", "missing");
  const Json& mesh_json = root["mesh"];
  if (!mesh_json.is_object() || mesh_json.empty()) {
    return PathError("mesh", absl::StrCat("expected a non-empty object of dim name -> size, got ",
                                          Describe(mesh_json)));
  }
  if (mesh_json.size() > static_cast<size_t>(kMaxMeshDims)) {
    return PathError(
        "mesh", absl::StrCat(mesh_json.size(), " dims, more than the limit of ", kMaxMeshDims));
  }
  for (auto it = mesh_json.begin(); it != mesh_json.end(); ++it) {
    if (it.key().empty()) return PathError("mesh", "empty dim name");
    if (it.key().size() > static_cast<size_t>(kMaxMeshDimNameBytes)) {
      return PathError("mesh",
                       absl::StrCat("dim name ", Quoted(it.key()), " of ", it.key().size(),
                                    " bytes, more than the limit of ", kMaxMeshDimNameBytes));
    }
    const std::string path = absl::StrCat("mesh.", it.key());
    CKPT_ASSIGN_OR_RETURN(int64_t size, PositiveInt(it.value(), path, kMaxWorldSize));
    names->push_back(it.key());
    shape->push_back(size);
  }
  return absl::OkStatus();
}

// "flat": {"over": "<mesh dim>"}: the index of that dim.
absl::StatusOr<int> ParseFlat(const Json& fj, const std::string& fpath,
                              const std::vector<std::string>& names) {
  if (!fj.is_object()) return PathError(fpath, "expected {\"over\": \"<mesh dim>\"}");
  CKPT_RETURN_IF_ERROR(CheckKeys(fj, fpath, {"over"}));
  if (!fj.contains("over") || !fj["over"].is_string()) {
    return PathError(fpath + ".over", "expected the name of a mesh dim");
  }
  const std::string& over = fj["over"].get_ref<const std::string&>();
  for (size_t d = 0; d < names.size(); ++d) {
    if (names[d] == over) return static_cast<int>(d);
  }
  return PathError(fpath + ".over", absl::StrCat(Quoted(over), " is not a mesh dim (",
                                                 absl::StrJoin(names, ", "), ")"));
}

absl::Status ParsePlacements(const Json& pj, const std::string& lpath,
                             const std::vector<std::string>& names, LayoutRule* rule) {
  if (!pj.is_array() || pj.size() != names.size()) {
    return PathError(
        lpath, absl::StrCat("expected an array of ", names.size(),
                            " placements, one per mesh dim (", absl::StrJoin(names, ", "), ")"));
  }
  for (size_t d = 0; d < pj.size(); ++d) {
    const std::string epath = absl::StrCat(lpath, "[", d, "]");
    std::optional<Placement> p;
    if (pj[d].is_string()) p = ParsePlacement(pj[d].get_ref<const std::string&>());
    if (!p) {
      return PathError(epath, absl::StrCat("unknown placement ", Describe(pj[d]),
                                           " (expected \"Shard(<dim>)\" or \"Replicate()\")"));
    }
    if (rule->flat_dim && static_cast<int>(d) == *rule->flat_dim && p->is_shard()) {
      return PathError(epath, absl::StrCat("mesh dim \"", names[d],
                                           "\" carries the flat sharding; its box placement "
                                           "must be \"Replicate()\""));
    }
    rule->placements.push_back(*p);
  }
  return absl::OkStatus();
}

absl::StatusOr<LayoutRule> ParseRule(const Json& rj, const std::string& rpath,
                                     const std::vector<std::string>& names) {
  if (!rj.is_object()) return PathError(rpath, "expected an object");
  CKPT_RETURN_IF_ERROR(CheckKeys(rj, rpath, {"match", "regex", "placements", "flat"}));
  LayoutRule rule;
  if (rj.contains("match") == rj.contains("regex")) {
    return PathError(rpath, "needs exactly one of \"match\" (glob) or \"regex\"");
  }
  const char* pattern_field = rj.contains("match") ? "match" : "regex";
  const std::string ppath = absl::StrCat(rpath, ".", pattern_field);
  if (!rj[pattern_field].is_string()) return PathError(ppath, "expected a non-empty string");
  rule.pattern = rj[pattern_field].get<std::string>();
  rule.is_regex = rj.contains("regex");
  CKPT_ASSIGN_OR_RETURN(rule.matcher, CompilePattern(rule.pattern, rule.is_regex, ppath));
  if (rj.contains("flat")) {
    CKPT_ASSIGN_OR_RETURN(int flat_dim, ParseFlat(rj["flat"], rpath + ".flat", names));
    rule.flat_dim = flat_dim;
  }
  if (rj.contains("placements")) {
    CKPT_RETURN_IF_ERROR(ParsePlacements(rj["placements"], rpath + ".placements", names, &rule));
  } else if (rule.flat_dim) {
    rule.placements.assign(names.size(), Placement::Replicate());
  } else {
    return PathError(rpath, "needs \"placements\" and/or \"flat\"");
  }
  return rule;
}

}  // namespace

absl::StatusOr<LayoutSpec> LayoutSpec::Parse(absl::string_view json_text) {
  JsonLimits limits;
  limits.max_bytes = kMaxLayoutBytes;
  limits.max_depth = kMaxLayoutJsonDepth;
  absl::StatusOr<Json> parsed = ParseGuardedJson<Json>(json_text, limits);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(), absl::StrCat("layout ", parsed.status().message()));
  }
  const Json& root = *parsed;
  if (!root.is_object()) return PathError("(document)", "expected an object");
  CKPT_RETURN_IF_ERROR(CheckKeys(root, "", {"world_size", "mesh", "rules", "process_groups"}));

  std::vector<std::string> names;
  std::vector<int64_t> shape;
  CKPT_RETURN_IF_ERROR(ParseMesh(root, &names, &shape));
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape);
  if (!mesh.ok()) return PathError("mesh", mesh.status().message());
  if (root.contains("world_size")) {
    CKPT_ASSIGN_OR_RETURN(int64_t world,
                          PositiveInt(root["world_size"], "world_size", kMaxWorldSize));
    if (world != mesh->size()) {
      return PathError("world_size",
                       absl::StrCat(world, " does not equal the mesh's ", mesh->size(), " ranks (",
                                    ShapeString(shape), ")"));
    }
  }
  LayoutSpec spec(*std::move(mesh));
  spec.dim_names_ = names;
  if (root.contains("process_groups")) {
    CKPT_ASSIGN_OR_RETURN(spec.process_groups_,
                          ParseLayoutProcessGroups(root["process_groups"], spec.mesh_, names));
  }

  if (!root.contains("rules")) return PathError("rules", "missing");
  const Json& rules = root["rules"];
  if (!rules.is_array() || rules.empty()) {
    return PathError("rules", "expected a non-empty array of rules");
  }
  if (rules.size() > static_cast<size_t>(kMaxLayoutRules)) {
    return PathError(
        "rules", absl::StrCat(rules.size(), " rules, more than the limit of ", kMaxLayoutRules));
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    CKPT_ASSIGN_OR_RETURN(LayoutRule rule,
                          ParseRule(rules[r], absl::StrCat("rules[", r, "]"), names));
    spec.rules_.push_back(std::move(rule));
  }
  return spec;
}

absl::StatusOr<std::string> LayoutSpec::ReadFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot open layout file ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("layout file ", path, " is not a regular file"));
  }
  if (st.st_size > kMaxLayoutBytes) {
    return absl::InvalidArgumentError(absl::StrCat("layout file ", path, " has ", st.st_size,
                                                   " bytes, more than the limit of ",
                                                   kMaxLayoutBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open layout file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in && !in.eof())
    return absl::UnavailableError(absl::StrCat("cannot read layout file ", path));
  return buffer.str();
}

absl::StatusOr<LayoutSpec> LayoutSpec::FromFile(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<LayoutSpec> spec = Parse(text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

absl::StatusOr<const LayoutRule*> LayoutSpec::RuleFor(absl::string_view key) const {
  for (const LayoutRule& rule : rules_) {
    if (rule.Matches(key)) return &rule;
  }
  return absl::NotFoundError(absl::StrCat("tensor ", Quoted(key),
                                          " matches no rule of the layout (", rules_.size(),
                                          " rules); add a rule for it"));
}

absl::Status LayoutSpec::TensorError(const TensorMeta& tensor, const LayoutRule& rule,
                                     const absl::Status& cause) const {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", Quoted(tensor.key), " ", ShapeString(tensor.global_shape),
                   " under rule ", Quoted(rule.pattern), " ", PlacementsString(rule.placements),
                   rule.flat_dim ? absl::StrCat(" flat over ", dim_names_[*rule.flat_dim]) : "",
                   ": ", cause.message()));
}

absl::StatusOr<TensorPiece> LayoutSpec::PieceAt(const TensorMeta& tensor, const LayoutRule& rule,
                                                int64_t rank, absl::Span<const int64_t> coord,
                                                const LocalShard& shard) const {
  TensorPiece piece;
  piece.key = tensor.key;
  piece.rank = rank;
  piece.dtype = tensor.dtype;
  piece.global_shape = tensor.global_shape;
  piece.region = shard.region();
  for (int d = 0; d < mesh_.ndim(); ++d) {
    if (!rule.placements[d].is_shard() && (!rule.flat_dim || d != *rule.flat_dim)) {
      piece.replica_id.push_back(coord[d]);
    }
  }
  if (rule.flat_dim) {
    // The box, flattened, split evenly over the flat dim: this rank's part, in O(1).
    absl::StatusOr<FlatRange> range = EvenFlatRange(
        piece.region.BoxElements(), mesh_.shape()[*rule.flat_dim], coord[*rule.flat_dim]);
    if (!range.ok()) return TensorError(tensor, rule, range.status());
    piece.region.flat = *range;
  }
  return piece;
}

absl::Status LayoutSpec::AppendPieces(const TensorMeta& tensor, bool drop_empty,
                                      std::vector<TensorPiece>* out) const {
  CKPT_ASSIGN_OR_RETURN(const LayoutRule* rule, RuleFor(tensor.key));
  absl::Status status = ForEachLocalShard(
      tensor.global_shape, mesh_, rule->placements,
      [&](int64_t rank, absl::Span<const int64_t> coord, const LocalShard& shard) -> absl::Status {
        CKPT_ASSIGN_OR_RETURN(TensorPiece piece, PieceAt(tensor, *rule, rank, coord, shard));
        if (!drop_empty || piece.region.NumElements() > 0) out->push_back(std::move(piece));
        return absl::OkStatus();
      });
  if (!status.ok() && !absl::StartsWith(status.message(), "tensor ")) {
    return TensorError(tensor, *rule, status);
  }
  return status;
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::PiecesOf(const TensorMeta& tensor) const {
  std::vector<TensorPiece> pieces;
  pieces.reserve(mesh_.size());
  CKPT_RETURN_IF_ERROR(AppendPieces(tensor, /*drop_empty=*/false, &pieces));
  return pieces;
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::AllPieces(absl::Span<const TensorMeta> tensors,
                                                               bool drop_empty) const {
  // tensors.size() < 2^43 (memory) and world size <= 2^20: the product fits.
  const int64_t pieces = static_cast<int64_t>(tensors.size()) * mesh_.size();
  if (pieces > kMaxLayoutPieces) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the layout's ", mesh_.size(), " ranks times ", tensors.size(), " tensors make ", pieces,
        " pieces, more than the limit of ", kMaxLayoutPieces, " pieces expanded at once"));
  }
  std::vector<TensorPiece> out;
  out.reserve(pieces);
  for (const TensorMeta& t : tensors) CKPT_RETURN_IF_ERROR(AppendPieces(t, drop_empty, &out));
  return out;
}

absl::StatusOr<std::vector<TensorPiece>> LayoutSpec::RankPieces(
    absl::Span<const TensorMeta> tensors, int64_t rank) const {
  if (rank < 0 || rank >= mesh_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the layout's ", mesh_.size(), " ranks"));
  }
  std::vector<TensorPiece> out;
  out.reserve(tensors.size());
  for (const TensorMeta& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(const LayoutRule* rule, RuleFor(t.key));
    absl::StatusOr<LocalShard> shard =
        ComputeLocalShard(t.global_shape, mesh_, rule->placements, rank);
    if (!shard.ok()) return TensorError(t, *rule, shard.status());
    CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> coord, mesh_.Coordinate(rank));
    CKPT_ASSIGN_OR_RETURN(TensorPiece piece, PieceAt(t, *rule, rank, coord, *shard));
    out.push_back(std::move(piece));
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
