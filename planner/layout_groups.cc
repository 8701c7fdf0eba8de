#include "planner/layout_groups.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;

absl::Status FieldError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("layout process_groups", path, ": ", what));
}

absl::StatusOr<ProcessGroups> Along(const Json& dims, const DeviceMesh& mesh,
                                    const std::vector<std::string>& names) {
  if (!dims.is_array() || dims.empty()) {
    return FieldError(".along", "expected a non-empty array of mesh dim names");
  }
  std::vector<int> along;
  for (size_t i = 0; i < dims.size(); ++i) {
    const std::string path = absl::StrCat(".along[", i, "]");
    if (!dims[i].is_string()) return FieldError(path, "expected a mesh dim name");
    auto it = std::find(names.begin(), names.end(), dims[i].get<std::string>());
    if (it == names.end()) {
      return FieldError(path,
                        absl::StrCat("\"", dims[i].get<std::string>(), "\" is not a mesh dim (",
                                     absl::StrJoin(names, ", "), ")"));
    }
    along.push_back(static_cast<int>(it - names.begin()));
  }
  return GroupsAlongMeshDims(mesh, along);
}

absl::StatusOr<ProcessGroupSpec> ExplicitSpec(const Json& value) {
  ProcessGroupSpec spec;
  spec.shape = ProcessGroupSpec::Shape::kExplicit;
  for (size_t g = 0; g < value.size(); ++g) {
    if (!value[g].is_array()) return FieldError(absl::StrCat("[", g, "]"), "expected rank list");
    std::vector<int64_t> ranks;
    for (size_t i = 0; i < value[g].size(); ++i) {
      const Json& r = value[g][i];
      if (!r.is_number_integer()) {
        return FieldError(absl::StrCat("[", g, "][", i, "]"), "expected a rank (an integer)");
      }
      ranks.push_back(r.get<int64_t>());
    }
    spec.ranks.push_back(std::move(ranks));
  }
  return spec;
}

}  // namespace

ProcessGroups GroupsAlongMeshDims(const DeviceMesh& mesh, const std::vector<int>& along) {
  std::map<std::vector<int64_t>, size_t> group_of_key;
  ProcessGroups groups;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    std::vector<int64_t> key = *mesh.Coordinate(r);
    for (int d : along) key[d] = 0;
    auto [it, fresh] = group_of_key.emplace(std::move(key), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(r);
  }
  return groups;
}

absl::StatusOr<ProcessGroups> ParseLayoutProcessGroups(const Json& value, const DeviceMesh& mesh,
                                                       const std::vector<std::string>& dim_names) {
  ProcessGroupSpec spec;
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it.key() != "along" && it.key() != "comment") {
        return FieldError(absl::StrCat(".", it.key()), "unknown field (allowed: along)");
      }
    }
    if (!value.contains("along")) return FieldError(".along", "missing");
    return Along(value["along"], mesh, dim_names);
  }
  if (value.is_string()) {
    absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(value.get<std::string>());
    if (!parsed.ok()) return FieldError("", std::string(parsed.status().message()));
    spec = *std::move(parsed);
  } else if (value.is_array()) {
    absl::StatusOr<ProcessGroupSpec> parsed = ExplicitSpec(value);
    if (!parsed.ok()) return parsed.status();
    spec = *std::move(parsed);
  } else {
    return FieldError("", "expected a spec string, a list of rank lists or {\"along\": [dims]}");
  }
  if (spec.shape == ProcessGroupSpec::Shape::kPerNode) {
    return FieldError("",
                      "per-node groups come from the workers' hosts, which a layout does not "
                      "know: declare them with the save or load options");
  }
  absl::StatusOr<ProcessGroups> groups = ResolveProcessGroups(spec, mesh.size());
  if (!groups.ok()) return FieldError("", std::string(groups.status().message()));
  return groups;
}

}  // namespace ckpt
