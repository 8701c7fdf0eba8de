#include "tools/ckptctl/plan_lines.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "planner/distribute.h"
#include "planner/main_replica.h"
#include "planner/process_groups.h"
#include "sharding/dtensor.h"
#include "tools/ckptctl/distribute_line_fast.h"

namespace ckpt::ckptctl {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Field path inside one line, e.g. shard_to_size[3][1], for error messages.
absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("field ", field, ": ", what));
}

absl::StatusOr<int64_t> ParseInt(const Json& v, const std::string& field) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return FieldError(field, "integer out of range");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 itself is out of range; every double below it converts exactly.
    if (std::isfinite(d) && d == std::floor(d) && d >= -9223372036854775808.0 &&
        d < 9223372036854775808.0) {
      return static_cast<int64_t>(d);
    }
    return FieldError(field, absl::StrCat("expected an integer, got ", v.dump()));
  }
  return FieldError(field, absl::StrCat("expected an integer, got ", v.type_name()));
}

absl::StatusOr<const Json*> Member(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) return FieldError(name, "missing");
  return &*it;
}

absl::StatusOr<int64_t> ParseNumRanks(const Json& line) {
  CKPT_ASSIGN_OR_RETURN(const Json* n, Member(line, "num_ranks"));
  CKPT_ASSIGN_OR_RETURN(int64_t num_ranks, ParseInt(*n, "num_ranks"));
  if (num_ranks < 0 || num_ranks > kMaxWorldSize) {
    return FieldError("num_ranks", absl::StrCat(num_ranks, " is outside [0, ", kMaxWorldSize,
                                                "] (the limit on ranks)"));
  }
  return num_ranks;
}

absl::Status ExpectArray(const Json& v, const std::string& field) {
  if (!v.is_array())
    return FieldError(field, absl::StrCat("expected an array, got ", v.type_name()));
  return absl::OkStatus();
}

absl::StatusOr<PieceId> ParsePieceId(const Json& v, const std::string& field) {
  if (!v.is_array() || v.size() != 3) {
    return FieldError(field, "expected a shard id [key, [offsets...], null | [start, stop]]");
  }
  PieceId id;
  if (!v[0].is_string()) return FieldError(field + "[0]", "expected a string key");
  id.key = v[0].get<std::string>();
  CKPT_RETURN_IF_ERROR(ExpectArray(v[1], field + "[1]"));
  for (size_t i = 0; i < v[1].size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(int64_t off, ParseInt(v[1][i], absl::StrCat(field, "[1][", i, "]")));
    id.offsets.push_back(off);
  }
  if (!v[2].is_null()) {
    if (!v[2].is_array() || v[2].size() != 2) {
      return FieldError(field + "[2]", "expected null or [start, stop]");
    }
    CKPT_ASSIGN_OR_RETURN(int64_t start, ParseInt(v[2][0], field + "[2][0]"));
    CKPT_ASSIGN_OR_RETURN(int64_t stop, ParseInt(v[2][1], field + "[2][1]"));
    id.flat = FlatRange{start, stop};
  }
  return id;
}

OrderedJson PieceIdJson(const PieceId& id) {
  OrderedJson offsets = OrderedJson::array();
  for (int64_t o : id.offsets) offsets.push_back(o);
  OrderedJson flat = id.flat ? OrderedJson::array({id.flat->start, id.flat->stop}) : nullptr;
  return OrderedJson::array({id.key, std::move(offsets), std::move(flat)});
}

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The DOM path's reading of a distribute line: every check, each error naming its field.
absl::StatusOr<DistributionInput> ReadDistributeInput(const Json& line,
                                                      const PlanOptions& options) {
  CKPT_ASSIGN_OR_RETURN(int64_t num_ranks, ParseNumRanks(line));
  CKPT_ASSIGN_OR_RETURN(const Json* to_ranks, Member(line, "shard_to_ranks"));
  CKPT_RETURN_IF_ERROR(ExpectArray(*to_ranks, "shard_to_ranks"));
  CKPT_ASSIGN_OR_RETURN(const Json* to_size, Member(line, "shard_to_size"));
  CKPT_RETURN_IF_ERROR(ExpectArray(*to_size, "shard_to_size"));

  DistributionInput input;
  input.num_ranks = num_ranks;
  absl::flat_hash_map<PieceId, int32_t> index;
  for (size_t i = 0; i < to_ranks->size(); ++i) {
    const std::string field = absl::StrCat("shard_to_ranks[", i, "]");
    const Json& entry = (*to_ranks)[i];
    if (!entry.is_array() || entry.size() != 2)
      return FieldError(field, "expected [id, [ranks...]]");
    CKPT_ASSIGN_OR_RETURN(PieceId id, ParsePieceId(entry[0], field + "[0]"));
    CKPT_RETURN_IF_ERROR(ExpectArray(entry[1], field + "[1]"));
    std::vector<int64_t> ranks;
    ranks.reserve(entry[1].size());
    for (size_t r = 0; r < entry[1].size(); ++r) {
      const std::string rank_field = absl::StrCat(field, "[1][", r, "]");
      CKPT_ASSIGN_OR_RETURN(int64_t rank, ParseInt(entry[1][r], rank_field));
      // Megatron's min() skips such holders silently; here they are a mistake in the input.
      if ((rank < 0 || rank >= num_ranks) && !options.keep_out_of_range_ranks) {
        return FieldError(rank_field,
                          absl::StrCat("rank ", rank, " is outside [0, ", num_ranks, ")"));
      }
      ranks.push_back(rank);
    }
    if (index.contains(id)) return FieldError(field, "repeats shard " + id.DebugString());
    index.emplace(id, static_cast<int32_t>(input.shards.size()));
    input.AddShard(std::move(id), std::nullopt, std::move(ranks));
  }
  absl::flat_hash_set<PieceId> sized;
  for (size_t i = 0; i < to_size->size(); ++i) {
    const std::string field = absl::StrCat("shard_to_size[", i, "]");
    const Json& entry = (*to_size)[i];
    if (!entry.is_array() || entry.size() != 2) return FieldError(field, "expected [id, bytes]");
    CKPT_ASSIGN_OR_RETURN(PieceId id, ParsePieceId(entry[0], field + "[0]"));
    CKPT_ASSIGN_OR_RETURN(int64_t bytes, ParseInt(entry[1], field + "[1]"));
    if (!sized.insert(id).second) return FieldError(field, "repeats shard " + id.DebugString());
    auto it = index.find(id);
    if (it != index.end()) input.shards[it->second].size_bytes = bytes;  // others: unused
  }
  if (auto it = line.find("cross_group"); it != line.end()) {
    CKPT_RETURN_IF_ERROR(ExpectArray(*it, "cross_group"));
    for (size_t i = 0; i < it->size(); ++i) {
      CKPT_ASSIGN_OR_RETURN(PieceId id,
                            ParsePieceId((*it)[i], absl::StrCat("cross_group[", i, "]")));
      auto found = index.find(id);
      if (found != index.end()) input.shards[found->second].cross_group = true;
    }
  }

  for (const DistributablePiece& s : input.shards) {
    if (!s.size_bytes) {
      return FieldError("shard_to_size", absl::StrCat("no entry for shard ", s.id.DebugString(),
                                                      " listed in shard_to_ranks"));
    }
  }

  return input;
}

// Distributes a checked input and writes its output line.
absl::StatusOr<std::string> DistributeAndFormat(const DistributionInput& input) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<ShardAssignment>> assignment = DistributeShardsToRanks(input);
  const double seconds = SecondsSince(start);
  if (!assignment.ok()) {
    return FieldError("shard_to_ranks", std::string(assignment.status().message()));
  }
  return FormatDistributeResult(input, *assignment, seconds);
}

// The fast path's line, distributed; on any error (the DOM path words it) nullopt.
std::optional<std::string> DistributeFastLine(const FastDistributeLine& line) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<ShardAssignment>> assignment = DistributeShardsToRanks(line.input);
  const double seconds = SecondsSince(start);
  if (!assignment.ok()) return std::nullopt;
  return FormatDistributeResult(line.ids, *assignment, seconds);
}

// A distribution as megatron-core's ShardDistribution fields (null for a trivial group).
OrderedJson DistributionJson(const std::optional<MainReplicaDistribution>& distribution) {
  if (!distribution) return nullptr;
  const MainReplicaDistribution& d = *distribution;
  OrderedJson main_rank = OrderedJson::array();
  for (const auto& [id, rank] : d.main_rank_for_shard) {
    main_rank.push_back(OrderedJson::array({PieceIdJson(id), rank}));
  }
  OrderedJson in_group = OrderedJson::array();
  for (const PieceId& id : d.shards_in_this_group) in_group.push_back(PieceIdJson(id));
  OrderedJson all_ranks = OrderedJson::array();
  for (const auto& [id, ranks] : d.all_ranks_for_shard) {
    all_ranks.push_back(OrderedJson::array({PieceIdJson(id), OrderedJson(ranks)}));
  }
  OrderedJson dist;
  dist["main_rank_for_shard"] = std::move(main_rank);
  dist["shards_in_this_group"] = std::move(in_group);
  dist["all_ranks_for_shard"] = std::move(all_ranks);
  return dist;
}

// The "groups" field: a process-group spec (planner/process_groups.h; not per-node) or a list
// of rank lists, resolved against the line's ranks.
absl::StatusOr<ProcessGroups> ParseGroupsField(const Json& field, int64_t num_ranks) {
  ProcessGroupSpec spec;
  if (field.is_string()) {
    absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(field.get<std::string>());
    if (!parsed.ok()) return FieldError("groups", std::string(parsed.status().message()));
    spec = *std::move(parsed);
  } else {
    CKPT_RETURN_IF_ERROR(ExpectArray(field, "groups"));
    spec.shape = ProcessGroupSpec::Shape::kExplicit;
    for (size_t g = 0; g < field.size(); ++g) {
      CKPT_RETURN_IF_ERROR(ExpectArray(field[g], absl::StrCat("groups[", g, "]")));
      std::vector<int64_t> ranks;
      for (size_t i = 0; i < field[g].size(); ++i) {
        CKPT_ASSIGN_OR_RETURN(int64_t rank,
                              ParseInt(field[g][i], absl::StrCat("groups[", g, "][", i, "]")));
        ranks.push_back(rank);
      }
      spec.ranks.push_back(std::move(ranks));
    }
  }
  absl::StatusOr<ProcessGroups> groups = ResolveProcessGroups(spec, num_ranks);
  if (!groups.ok()) return FieldError("groups", std::string(groups.status().message()));
  return groups;
}

// main-replicas with "groups": one distribution per group, each with the group as the
// parallelization group (group ranks, as megatron-core returns them), and the save's writer
// of every main replica in global ranks.
absl::StatusOr<std::string> RunMainReplicasPerGroup(
    const Json& field, const std::vector<std::vector<RankShardInfo>>& per_rank,
    bool ignore_groups) {
  CKPT_ASSIGN_OR_RETURN(ProcessGroups groups,
                        ParseGroupsField(field, static_cast<int64_t>(per_rank.size())));
  const auto start = std::chrono::steady_clock::now();
  auto per_group = DetermineMainReplicasPerGroup(per_rank, groups, ignore_groups);
  const double seconds = SecondsSince(start);
  if (!per_group.ok()) return FieldError("per_rank", std::string(per_group.status().message()));
  OrderedJson out_groups = OrderedJson::array();
  for (const GroupMainReplicas& g : *per_group) {
    OrderedJson entry;
    entry["ranks"] = g.ranks;
    entry["distribution"] = DistributionJson(g.distribution);
    out_groups.push_back(std::move(entry));
  }
  OrderedJson out;
  out["groups"] = std::move(out_groups);
  if (!ignore_groups) {
    OrderedJson list = OrderedJson::array();
    for (const auto& [id, rank] : WritersOfGroups(per_rank, *per_group)) {
      list.push_back(OrderedJson::array({PieceIdJson(id), rank}));
    }
    out["writers"] = std::move(list);
  }
  out["plan_seconds"] = seconds;
  return Dump(out);
}

absl::StatusOr<std::string> RunMainReplicas(const Json& line, const PlanOptions& options) {
  CKPT_ASSIGN_OR_RETURN(int64_t num_ranks, ParseNumRanks(line));
  bool ignore_groups = false;
  if (auto it = line.find("ignore_groups"); it != line.end()) {
    if (!it->is_boolean()) return FieldError("ignore_groups", "expected true or false");
    ignore_groups = it->get<bool>();
  }
  CKPT_ASSIGN_OR_RETURN(const Json* per_rank_json, Member(line, "per_rank"));
  CKPT_RETURN_IF_ERROR(ExpectArray(*per_rank_json, "per_rank"));
  // One list per rank, also for groups of 0 and 1 (whose distribution is null).
  if (static_cast<int64_t>(per_rank_json->size()) != num_ranks) {
    return FieldError("per_rank", absl::StrCat("has ", per_rank_json->size(),
                                               " lists for num_ranks ", num_ranks));
  }
  std::vector<std::vector<RankShardInfo>> per_rank(per_rank_json->size());
  for (size_t r = 0; r < per_rank_json->size(); ++r) {
    const Json& list = (*per_rank_json)[r];
    CKPT_RETURN_IF_ERROR(ExpectArray(list, absl::StrCat("per_rank[", r, "]")));
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = absl::StrCat("per_rank[", r, "][", i, "]");
      const Json& e = list[i];
      if (!e.is_array() || e.size() != 3) return FieldError(field, "expected [id, bytes, is_main]");
      CKPT_ASSIGN_OR_RETURN(PieceId id, ParsePieceId(e[0], field + "[0]"));
      CKPT_ASSIGN_OR_RETURN(int64_t bytes, ParseInt(e[1], field + "[1]"));
      if (!e[2].is_boolean()) return FieldError(field + "[2]", "expected true or false");
      per_rank[r].push_back(RankShardInfo{std::move(id), bytes, e[2].get<bool>()});
    }
  }
  if (auto it = line.find("groups"); it != line.end()) {
    return RunMainReplicasPerGroup(*it, per_rank, ignore_groups);
  }
  if (!options.groups.empty()) {
    return RunMainReplicasPerGroup(Json(options.groups), per_rank, ignore_groups);
  }
  const auto start = std::chrono::steady_clock::now();
  auto distribution = DetermineMainReplicaDistribution(per_rank, num_ranks, ignore_groups);
  const double seconds = SecondsSince(start);
  if (!distribution.ok()) {
    return FieldError("per_rank", std::string(distribution.status().message()));
  }
  OrderedJson out;
  out["distribution"] = DistributionJson(*distribution);
  if (distribution->has_value()) out["plan_seconds"] = seconds;
  return Dump(out);
}

// json_guard's "<path>: what" in this tool's words: "field <path>: what", or just "what"
// for the whole line.
absl::Status GuardError(const absl::Status& status) {
  absl::string_view message = status.message();
  if (absl::ConsumePrefix(&message, "(document): ")) return absl::Status(status.code(), message);
  return absl::Status(status.code(), absl::StrCat("field ", message));
}

// One line's DOM, bounded by PlanLineLimits(); it must be an object.
absl::StatusOr<Json> ParseLineObject(absl::string_view line) {
  absl::StatusOr<Json> parsed = ParseGuardedJson<Json>(line, PlanLineLimits());
  if (!parsed.ok()) return GuardError(parsed.status());
  if (!parsed->is_object()) return absl::InvalidArgumentError("expected a JSON object");
  return parsed;
}

}  // namespace

JsonLimits PlanLineLimits() {
  JsonLimits limits;
  limits.max_bytes = int64_t{1} << 32;
  limits.max_depth = 16;
  limits.max_values = int64_t{1} << 28;
  limits.max_string_bytes = int64_t{1} << 20;
  return limits;
}

absl::StatusOr<std::string> RunPlanLine(PlanMode mode, absl::string_view line,
                                        const PlanOptions& options) {
  try {
    if (mode == PlanMode::kDistribute) {
      std::optional<FastDistributeLine> fast =
          ParseDistributeLineFast(line, options.keep_out_of_range_ranks);
      if (fast) {
        std::optional<std::string> result = DistributeFastLine(*fast);
        if (result) return *std::move(result);
        // E.g. a shard repeated in shard_to_ranks: the DOM path words the error with its field.
      }
    }
    return RunPlanLineViaDom(mode, line, options);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: no exception leaves this module
    return absl::ResourceExhaustedError(absl::StrCat("cannot plan this line: ", e.what()));
  }
}

absl::StatusOr<std::string> RunPlanLineViaDom(PlanMode mode, absl::string_view line,
                                              const PlanOptions& options) {
  try {
    if (mode == PlanMode::kMainReplicas) {
      CKPT_ASSIGN_OR_RETURN(Json parsed, ParseLineObject(line));
      return RunMainReplicas(parsed, options);
    }
    CKPT_ASSIGN_OR_RETURN(DistributionInput input, ParseDistributeLineViaDom(line, options));
    return DistributeAndFormat(input);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: no exception leaves this module
    return absl::ResourceExhaustedError(absl::StrCat("cannot plan this line: ", e.what()));
  }
}

absl::StatusOr<DistributionInput> ParseDistributeLineViaDom(absl::string_view line,
                                                            const PlanOptions& options) {
  try {
    CKPT_ASSIGN_OR_RETURN(Json parsed, ParseLineObject(line));
    return ReadDistributeInput(parsed, options);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot plan this line: ", e.what()));
  }
}

absl::StatusOr<std::string> RunPlanLines(PlanMode mode, absl::string_view text,
                                         const PlanOptions& options) {
  return RunEachLine(
      text, [mode, &options](absl::string_view line) { return RunPlanLine(mode, line, options); });
}

absl::StatusOr<std::string> RunEachLine(
    absl::string_view text,
    const std::function<absl::StatusOr<std::string>(absl::string_view line)>& run_line) {
  std::string output;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == absl::string_view::npos) continue;
    absl::StatusOr<std::string> result = run_line(line);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat("line ", line_no, ": ", result.status().message()));
    }
    if (output.empty()) {
      output = std::move(*result);  // the usual single line: no copy
    } else {
      output += *result;
    }
    output += '\n';
  }
  return output;
}

}  // namespace ckpt::ckptctl
