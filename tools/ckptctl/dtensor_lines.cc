#include "tools/ckptctl/dtensor_lines.h"

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/json_guard.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "sharding/dtensor.h"
#include "tools/ckptctl/plan_lines.h"

namespace ckpt::ckptctl {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("field ", field, ": ", what));
}

// Limits of one line: small documents (a layout), but a mesh's worth of ranks to list.
JsonLimits DTensorLineLimits() {
  JsonLimits limits;
  limits.max_bytes = int64_t{64} << 20;
  limits.max_depth = 4;
  limits.max_values = int64_t{4} << 20;
  limits.max_string_bytes = 64;
  return limits;
}

absl::StatusOr<std::vector<int64_t>> ParseIntArray(const Json& line, const char* name,
                                                   bool required) {
  std::vector<int64_t> out;
  auto it = line.find(name);
  if (it == line.end()) {
    if (required) return FieldError(name, "missing");
    return out;
  }
  if (!it->is_array()) return FieldError(name, "expected an array of integers");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& v = (*it)[i];
    if (!v.is_number_integer()) {
      return FieldError(absl::StrCat(name, "[", i, "]"),
                        absl::StrCat("expected an integer, got ", v.dump()));
    }
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return FieldError(absl::StrCat(name, "[", i, "]"), "integer out of range");
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// "Shard(<dim>)" (dim may be negative) or "Replicate()".
absl::StatusOr<Placement> ParsePlacement(const Json& v, const std::string& field) {
  const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
  absl::string_view rest = text;
  int dim = 0;
  if (v.is_string() && rest == "Replicate()") return Placement::Replicate();
  if (v.is_string() && absl::ConsumePrefix(&rest, "Shard(") && absl::ConsumeSuffix(&rest, ")") &&
      absl::SimpleAtoi(rest, &dim)) {
    return Placement::Shard(dim);
  }
  return FieldError(field,
                    absl::StrCat("expected \"Shard(<dim>)\" or \"Replicate()\", got ", text));
}

Json ShardJson(const LocalShard& shard) {
  return Json::array({shard.shape, shard.offset, shard.replica_id});
}

absl::StatusOr<std::string> RunLine(const Json& line) {
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> global_shape,
                        ParseIntArray(line, "global_shape", true));
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> mesh_shape, ParseIntArray(line, "mesh_shape", true));
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, ParseIntArray(line, "ranks", false));
  auto placements_json = line.find("placements");
  if (placements_json == line.end()) return FieldError("placements", "missing");
  if (!placements_json->is_array()) return FieldError("placements", "expected an array");
  std::vector<Placement> placements;
  for (size_t i = 0; i < placements_json->size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(
        Placement p, ParsePlacement((*placements_json)[i], absl::StrCat("placements[", i, "]")));
    placements.push_back(p);
  }
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(mesh_shape);
  if (!mesh.ok()) return FieldError("mesh_shape", std::string(mesh.status().message()));
  absl::Status valid = ValidatePlacements(global_shape, *mesh, placements);
  if (!valid.ok()) return FieldError("placements", std::string(valid.message()));

  Json shards = Json::array();
  if (line.contains("ranks")) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      absl::StatusOr<LocalShard> shard =
          ComputeLocalShard(global_shape, *mesh, placements, ranks[i]);
      if (!shard.ok()) {
        return FieldError(absl::StrCat("ranks[", i, "]"), std::string(shard.status().message()));
      }
      shards.push_back(ShardJson(*shard));
    }
  } else {
    CKPT_RETURN_IF_ERROR(
        ForEachLocalShard(global_shape, *mesh, placements,
                          [&](int64_t, absl::Span<const int64_t>, const LocalShard& shard) {
                            shards.push_back(ShardJson(shard));
                            return absl::OkStatus();
                          }));
  }
  Json out;
  out["shards"] = std::move(shards);
  return out.dump();
}

}  // namespace

absl::StatusOr<std::string> RunDTensorLine(absl::string_view line) {
  try {
    absl::StatusOr<Json> parsed = ParseGuardedJson<Json>(line, DTensorLineLimits());
    if (!parsed.ok()) return parsed.status();
    if (!parsed->is_object()) return absl::InvalidArgumentError("expected a JSON object");
    return RunLine(*parsed);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: no exception leaves this module
    return absl::ResourceExhaustedError(absl::StrCat("cannot compute this line: ", e.what()));
  }
}

absl::StatusOr<std::string> RunDTensorLines(absl::string_view text) {
  return RunEachLine(text, RunDTensorLine);
}

}  // namespace ckpt::ckptctl
