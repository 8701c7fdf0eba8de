#include "coordinator/group_plan.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator {
namespace {

std::vector<std::string> HostsOf(const Operation& op) {
  std::vector<std::string> hosts;
  hosts.reserve(op.ranks.size());
  for (const RankEntry& e : op.ranks) hosts.push_back(e.location.host);
  return hosts;
}

absl::Status Prefixed(const absl::Status& s, const std::string& who) {
  return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
}

}  // namespace

absl::Status CheckProcessGroupSpec(const std::string& spec, int world_size,
                                   const std::string& who) {
  absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(spec);
  if (!parsed.ok()) return Prefixed(parsed.status(), who);
  // One group of every rank is valid for any job; resolving it per join cost O(world size)
  // per join, so O(ranks^2) per gather (4% of a 10k-rank save's coordinator CPU).
  if (parsed->IsJob() || parsed->shape == ProcessGroupSpec::Shape::kPerNode) {
    return absl::OkStatus();
  }
  absl::StatusOr<ProcessGroups> groups = ResolveProcessGroups(*parsed, world_size);
  return groups.ok() ? absl::OkStatus() : Prefixed(groups.status(), who);
}

bool DeclaresProcessGroups(const Operation& op) {
  absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(op.process_groups);
  return !parsed.ok() || !parsed->IsJob();
}

absl::StatusOr<ProcessGroups> OperationGroups(const Operation& op) {
  absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(op.process_groups);
  if (!parsed.ok()) return Prefixed(parsed.status(), op.DebugString());
  absl::StatusOr<ProcessGroups> groups = ResolveProcessGroups(*parsed, op.world_size, HostsOf(op));
  if (!groups.ok()) return Prefixed(groups.status(), op.DebugString());
  return groups;
}

absl::StatusOr<LoadGroupChoice> ChooseLoadGroups(const Operation& op, bool auto_load) {
  LoadGroupChoice choice;
  if (DeclaresProcessGroups(op)) {
    absl::StatusOr<ProcessGroups> groups = OperationGroups(op);
    if (!groups.ok()) return groups.status();
    choice.groups = *std::move(groups);
    choice.reason = absl::StrCat(
        "process groups ", op.process_groups, ": ", choice.groups.size(),
        " groups, each reading what it lacks from storage and exchanging only within itself");
    return choice;
  }
  const std::vector<std::string> hosts = HostsOf(op);
  ProcessGroups per_host = GroupsPerHost(hosts);
  if (auto_load && per_host.size() > 1) {
    choice.groups = std::move(per_host);
    choice.reason = absl::StrCat("auto: the ranks span ", choice.groups.size(),
                                 " hosts, so each node is one exchange group (per-node): it "
                                 "reads what its ranks need from storage and exchanges over its "
                                 "own host, never between hosts");
    return choice;
  }
  std::vector<int64_t> all(op.world_size);
  for (int r = 0; r < op.world_size; ++r) all[r] = r;
  choice.groups = {std::move(all)};
  return choice;
}

std::string SaveGroupsKey(const Operation& op) {
  if (!DeclaresProcessGroups(op)) return "";
  std::string key = op.process_groups;
  absl::StatusOr<ProcessGroupSpec> parsed = ParseProcessGroupSpec(op.process_groups);
  if (parsed.ok() && parsed->shape == ProcessGroupSpec::Shape::kPerNode) {
    for (const RankEntry& e : op.ranks) absl::StrAppend(&key, "\n", e.location.host);
  }
  return key;
}

}  // namespace ckpt::coordinator
