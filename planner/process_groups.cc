#include "planner/process_groups.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "sharding/dtensor.h"

namespace ckpt {
namespace {

absl::Status SpecError(absl::string_view text, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("process groups \"", absl::CHexEscape(text), "\": ", what));
}

// A non-negative integer of at most kMaxWorldSize, else nullopt.
std::optional<int64_t> ParseCount(absl::string_view digits) {
  int64_t value = 0;
  digits = absl::StripAsciiWhitespace(digits);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &value) || value > kMaxWorldSize) {
    return std::nullopt;
  }
  return value;
}

absl::StatusOr<ProcessGroupSpec> ParseExplicit(absl::string_view text) {
  ProcessGroupSpec spec;
  spec.shape = ProcessGroupSpec::Shape::kExplicit;
  int index = 0;
  for (absl::string_view group : absl::StrSplit(text, ';')) {
    std::vector<int64_t> ranks;
    for (absl::string_view item : absl::StrSplit(group, ',', absl::SkipWhitespace())) {
      std::optional<int64_t> rank = ParseCount(item);
      if (!rank) {
        return SpecError(text, absl::StrCat("group ", index, ": \"", absl::CHexEscape(item),
                                            "\" is not a rank (a non-negative integer)"));
      }
      ranks.push_back(*rank);
    }
    if (ranks.empty()) return SpecError(text, absl::StrCat("group ", index, " is empty"));
    spec.ranks.push_back(std::move(ranks));
    ++index;
  }
  return spec;
}

// Consecutive blocks of `size` ranks, or ranks r with equal r mod size (strided).
ProcessGroups SizedGroups(int64_t world_size, int64_t size, bool strided) {
  const int64_t count = world_size / size;
  ProcessGroups groups(strided ? size : count);
  for (int64_t r = 0; r < world_size; ++r) groups[strided ? r % size : r / size].push_back(r);
  return groups;
}

}  // namespace

absl::StatusOr<ProcessGroupSpec> ParseProcessGroupSpec(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  ProcessGroupSpec spec;
  if (trimmed.empty() || trimmed == "job") return spec;
  if (trimmed == "per-node") {
    spec.shape = ProcessGroupSpec::Shape::kPerNode;
    return spec;
  }
  if (absl::ascii_isdigit(trimmed.front())) return ParseExplicit(trimmed);
  static const std::map<std::string, ProcessGroupSpec::Shape, std::less<>> kSized = {
      {"read-groups", ProcessGroupSpec::Shape::kReadGroups},
      {"model-replica", ProcessGroupSpec::Shape::kModelReplica},
      {"data-parallel", ProcessGroupSpec::Shape::kDataParallel}};
  const size_t colon = trimmed.find(':');
  auto shape = kSized.find(trimmed.substr(0, colon));
  if (shape == kSized.end() || colon == absl::string_view::npos) {
    return SpecError(text,
                     "expected job, per-node, read-groups:K, model-replica:K, data-parallel:K or "
                     "explicit rank lists like 0,1;2,3");
  }
  std::optional<int64_t> size = ParseCount(trimmed.substr(colon + 1));
  if (!size || *size < 1) {
    return SpecError(text, "the group size K must be a positive integer");
  }
  spec.shape = shape->second;
  spec.size = *size;
  return spec;
}

std::string ProcessGroupSpecText(const ProcessGroupSpec& spec) {
  switch (spec.shape) {
    case ProcessGroupSpec::Shape::kJob:
      return "job";
    case ProcessGroupSpec::Shape::kPerNode:
      return "per-node";
    case ProcessGroupSpec::Shape::kReadGroups:
      return absl::StrCat("read-groups:", spec.size);
    case ProcessGroupSpec::Shape::kModelReplica:
      return absl::StrCat("model-replica:", spec.size);
    case ProcessGroupSpec::Shape::kDataParallel:
      return absl::StrCat("data-parallel:", spec.size);
    case ProcessGroupSpec::Shape::kExplicit:
      break;
  }
  std::vector<std::string> groups;
  for (const auto& g : spec.ranks) groups.push_back(absl::StrJoin(g, ","));
  return absl::StrJoin(groups, ";");
}

absl::Status ValidateProcessGroups(const ProcessGroups& groups, int64_t world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("process groups over ", world_size,
                                                   " ranks: the world size must be in [1, ",
                                                   kMaxWorldSize, "]"));
  }
  std::vector<int64_t> group_of(world_size, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("process group ", g, " is empty"));
    }
    for (int64_t rank : groups[g]) {
      if (rank < 0 || rank >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat("process group ", g, " names rank ", rank,
                                                       ", outside the job's ranks [0, ", world_size,
                                                       ")"));
      }
      if (group_of[rank] >= 0) {
        if (group_of[rank] == static_cast<int64_t>(g)) {
          return absl::InvalidArgumentError(
              absl::StrCat("process group ", g, " names rank ", rank, " twice"));
        }
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is in process groups ",
                                                       group_of[rank], " and ", g,
                                                       ": groups must partition the ranks"));
      }
      group_of[rank] = static_cast<int64_t>(g);
    }
  }
  for (int64_t r = 0; r < world_size; ++r) {
    if (group_of[r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " is in no process group: groups must partition the ", world_size, " ranks"));
    }
  }
  return absl::OkStatus();
}

ProcessGroups GroupsPerHost(absl::Span<const std::string> host_of_rank) {
  std::map<std::string, size_t, std::less<>> group_of_host;
  ProcessGroups groups;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    auto [it, fresh] = group_of_host.emplace(host_of_rank[r], groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(static_cast<int64_t>(r));
  }
  return groups;
}

absl::StatusOr<ProcessGroups> ResolveProcessGroups(const ProcessGroupSpec& spec, int64_t world_size,
                                                   absl::Span<const std::string> host_of_rank) {
  ProcessGroups groups;
  switch (spec.shape) {
    case ProcessGroupSpec::Shape::kJob:
      groups = SizedGroups(world_size, std::max<int64_t>(world_size, 1), false);
      break;
    case ProcessGroupSpec::Shape::kPerNode:
      if (static_cast<int64_t>(host_of_rank.size()) != world_size) {
        return absl::FailedPreconditionError(
            absl::StrCat("per-node process groups need the host of each of the ", world_size,
                         " ranks; ", host_of_rank.size(), " known"));
      }
      groups = GroupsPerHost(host_of_rank);
      break;
    case ProcessGroupSpec::Shape::kReadGroups:
    case ProcessGroupSpec::Shape::kModelReplica:
    case ProcessGroupSpec::Shape::kDataParallel:
      if (spec.size < 1 || world_size < 1 || world_size % spec.size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("process groups ", ProcessGroupSpecText(spec), ": the group size ",
                         spec.size, " does not divide the job's ", world_size, " ranks"));
      }
      groups =
          SizedGroups(world_size, spec.size, spec.shape == ProcessGroupSpec::Shape::kDataParallel);
      break;
    case ProcessGroupSpec::Shape::kExplicit:
      groups = spec.ranks;
      break;
  }
  CKPT_RETURN_IF_ERROR(ValidateProcessGroups(groups, world_size));
  for (auto& g : groups) std::sort(g.begin(), g.end());
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return groups;
}

std::vector<std::pair<int32_t, int64_t>> GroupOfRank(const ProcessGroups& groups,
                                                     int64_t world_size) {
  std::vector<std::pair<int32_t, int64_t>> out(world_size, {-1, -1});
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].size(); ++i) {
      out[groups[g][i]] = {static_cast<int32_t>(g), static_cast<int64_t>(i)};
    }
  }
  return out;
}

absl::StatusOr<std::vector<GroupMainReplicas>> DetermineMainReplicasPerGroup(
    const std::vector<std::vector<RankShardInfo>>& per_rank, const ProcessGroups& groups,
    bool ignore_groups) {
  CKPT_RETURN_IF_ERROR(ValidateProcessGroups(groups, static_cast<int64_t>(per_rank.size())));
  std::vector<GroupMainReplicas> out;
  out.reserve(groups.size());
  for (const std::vector<int64_t>& group : groups) {
    std::vector<int64_t> ranks = group;
    std::sort(ranks.begin(), ranks.end());
    std::vector<std::vector<RankShardInfo>> lists;
    lists.reserve(ranks.size());
    for (int64_t r : ranks) lists.push_back(per_rank[r]);
    absl::StatusOr<std::optional<MainReplicaDistribution>> d =
        DetermineMainReplicaDistribution(lists, static_cast<int64_t>(ranks.size()), ignore_groups);
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat("process group of ranks [", absl::StrJoin(ranks, ","),
                                       "]: ", d.status().message()));
    }
    out.push_back(GroupMainReplicas{std::move(ranks), *std::move(d)});
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<PieceId, int64_t>>> MainReplicaWritersPerGroup(
    const std::vector<std::vector<RankShardInfo>>& per_rank, const ProcessGroups& groups) {
  CKPT_ASSIGN_OR_RETURN(std::vector<GroupMainReplicas> per_group,
                        DetermineMainReplicasPerGroup(per_rank, groups, /*ignore_groups=*/false));
  return WritersOfGroups(per_rank, per_group);
}

std::vector<std::pair<PieceId, int64_t>> WritersOfGroups(
    const std::vector<std::vector<RankShardInfo>>& per_rank,
    const std::vector<GroupMainReplicas>& per_group) {
  std::vector<std::pair<PieceId, int64_t>> writers;
  for (const GroupMainReplicas& g : per_group) {
    if (!g.distribution) {  // one rank: it writes its own main replicas
      for (const RankShardInfo& info : per_rank[g.ranks.front()]) {
        if (info.is_main) writers.emplace_back(info.id, g.ranks.front());
      }
      continue;
    }
    for (const auto& [id, group_rank] : g.distribution->main_rank_for_shard) {
      writers.emplace_back(id, g.ranks[group_rank]);
    }
  }
  return writers;
}

}  // namespace ckpt
