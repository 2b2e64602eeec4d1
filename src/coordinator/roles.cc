// include/ember/roles.h: role assignment (executor id -> (job_name,
// task_index), TFoS order) and the training-rank rules derived from it.
#include "ember/roles.h"

#include <algorithm>
#include <string>

namespace ember {

Result<RoleAssignment> AssignRole(const ClusterLayout& layout, int executor_id) {
  if (layout.num_nodes < 1) {
    return Status::InvalidArgument("layout.num_nodes must be >= 1, got " +
                                   std::to_string(layout.num_nodes));
  }
  if (layout.num_ps < 0) {
    return Status::InvalidArgument("layout.num_ps must be >= 0, got " +
                                   std::to_string(layout.num_ps));
  }
  if (!layout.master_node.empty() && layout.master_node != "chief" &&
      layout.master_node != "master") {
    return Status::InvalidArgument("layout.master_node must be \"\", \"chief\" or \"master\", got \"" +
                                   layout.master_node + "\"");
  }
  const int special = layout.num_ps + (layout.master_node.empty() ? 0 : 1) + (layout.eval_node ? 1 : 0);
  if (special > layout.num_nodes) {
    return Status::InvalidArgument(
        "layout.num_nodes (" + std::to_string(layout.num_nodes) + ") is too small for num_ps=" +
        std::to_string(layout.num_ps) + (layout.master_node.empty() ? "" : " + 1 " + layout.master_node) +
        (layout.eval_node ? " + 1 evaluator" : ""));
  }
  if (executor_id < 0 || executor_id >= layout.num_nodes) {
    return Status::InvalidArgument("executor id " + std::to_string(executor_id) +
                                   " is out of range: the job has " +
                                   std::to_string(layout.num_nodes) + " nodes (0.." +
                                   std::to_string(layout.num_nodes - 1) + ")");
  }
  int id = executor_id;
  if (id < layout.num_ps) return RoleAssignment{"ps", id};
  id -= layout.num_ps;
  if (!layout.master_node.empty()) {
    if (id == 0) return RoleAssignment{layout.master_node, 0};
    --id;
  }
  if (layout.eval_node) {
    if (id == 0) return RoleAssignment{"evaluator", 0};
    --id;
  }
  return RoleAssignment{"worker", id};
}

bool IsTrainingRole(std::string_view job_name) {
  return std::find(kTrainingRoles.begin(), kTrainingRoles.end(), job_name) != kTrainingRoles.end();
}

int TrainingSize(const ClusterSpec& spec) {
  int n = 0;
  for (std::string_view role : kTrainingRoles) {
    auto it = spec.find(std::string(role));
    if (it != spec.end()) n += static_cast<int>(it->second.size());
  }
  return n;
}

std::optional<int> TrainingRank(const ClusterSpec& spec, std::string_view job_name, int task_index) {
  int rank = 0;
  for (std::string_view role : kTrainingRoles) {
    auto it = spec.find(std::string(role));
    const int n = it == spec.end() ? 0 : static_cast<int>(it->second.size());
    if (role == job_name) {
      if (task_index < 0 || task_index >= n) return std::nullopt;
      return rank + task_index;
    }
    rank += n;
  }
  return std::nullopt;
}

std::vector<std::string> TrainingAddresses(const ClusterSpec& spec) {
  std::vector<std::string> out;
  for (std::string_view role : kTrainingRoles) {
    auto it = spec.find(std::string(role));
    if (it != spec.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

}  // namespace ember
