// AssignRole: executor id -> (job_name, task_index), TFoS order.
#include <string>

#include "ember/coordinator.h"

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

}  // namespace ember
