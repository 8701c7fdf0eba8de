// The "process_groups" field of a target layout (docs/layout.md "Process groups"): the groups
// a job in that layout saves within (planner/process_groups.h), written as a spec string, a
// list of rank lists, or {"along": [mesh dims]}: the ranks that differ only along those dims
// form a group (along "dp": Megatron's data-parallel groups; along every model-parallel dim:
// one group per model replica).
#ifndef CKPT_PLANNER_LAYOUT_GROUPS_H_
#define CKPT_PLANNER_LAYOUT_GROUPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/process_groups.h"
#include "sharding/dtensor.h"

namespace ckpt {

// Resolves the field's value over the mesh's ranks. Per-node groups are refused (a layout
// does not know the hosts: declare them with the trainers' or operator's options). Errors are
// InvalidArgument "layout process_groups...: ..." naming the path, rank or group.
absl::StatusOr<ProcessGroups> ParseLayoutProcessGroups(const nlohmann::ordered_json& value,
                                                       const DeviceMesh& mesh,
                                                       const std::vector<std::string>& dim_names);

// The ranks of `mesh` grouped by their coordinates outside the dims `along` (indices), each
// group in ascending rank order, groups by first rank.
ProcessGroups GroupsAlongMeshDims(const DeviceMesh& mesh, const std::vector<int>& along);

}  // namespace ckpt

#endif  // CKPT_PLANNER_LAYOUT_GROUPS_H_
